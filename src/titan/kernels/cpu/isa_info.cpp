#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/isa_info.h"

namespace titan::kernels::cpu::TITAN_ISA {

#define TITAN_STRINGIFY2(x) #x
#define TITAN_STRINGIFY(x) TITAN_STRINGIFY2(x)
const char* isa_variant_name() { return TITAN_STRINGIFY(TITAN_ISA); }

}  // namespace titan::kernels::cpu::TITAN_ISA
