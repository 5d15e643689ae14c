// Reports which ISA variant a kernel call landed in (used by tests and logs).
#pragma once

#include "titan/kernels/dispatch.h"

#define TITAN_ISA_INFO_KERNELS const char* isa_variant_name();
TITAN_FOR_EACH_ISA(TITAN_ISA_INFO_KERNELS)
