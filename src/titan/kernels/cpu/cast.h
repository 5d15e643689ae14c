// Fast element-wise casts between f32 and bf16 / f16 (per-ISA variants; see cpu/isa.h).
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_CAST_KERNELS                                       \
  void cast_f32_to_bf16(bf16* y, const float* x, int64_t n);     \
  void cast_bf16_to_f32(float* y, const bf16* x, int64_t n);     \
  void cast_f32_to_f16(f16* y, const float* x, int64_t n);       \
  void cast_f16_to_f32(float* y, const f16* x, int64_t n);
TITAN_FOR_EACH_ISA(TITAN_CAST_KERNELS)
