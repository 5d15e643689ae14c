// Fast fused AdamW step (per-ISA variants; see cpu/isa.h). Semantics: ref/adamw.h.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/adamw_params.h"
#include "titan/kernels/dispatch.h"

#define TITAN_ADAMW_KERNELS \
  void adamw_step(float* p, float* m, float* v, bf16* p_bf16, const float* g, int64_t n, const AdamWParams& a);
TITAN_FOR_EACH_ISA(TITAN_ADAMW_KERNELS)
