// Fast rotary position embedding (per-ISA variants; see cpu/isa.h). Semantics as ref/rope.h,
// for T in {float, bf16} with f32 tables and f32 arithmetic.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/rope_params.h"

#define TITAN_ROPE_KERNELS                                                                               \
  template <class T>                                                                                     \
  void rope_forward(T* y, const T* x, const float* cos, const float* sin, const int32_t* positions,      \
                    const ::titan::kernels::RopeParams& s);                                              \
  template <class T>                                                                                     \
  void rope_backward(T* dx, const T* dy, const float* cos, const float* sin, const int32_t* positions,   \
                     const ::titan::kernels::RopeParams& s, bool accumulate);
TITAN_FOR_EACH_ISA(TITAN_ROPE_KERNELS)
