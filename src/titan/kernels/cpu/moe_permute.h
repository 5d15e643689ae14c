// Fast MoE permute / unpermute (per-ISA variants; see cpu/isa.h). Semantics as
// ref/moe_permute.h for T in {float, bf16}; routing weights and their gradients f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_MOE_PERMUTE_KERNELS                                                                               \
  template <class T>                                                                                            \
  void moe_permute_forward(T* xs, const T* x, const int32_t* pos, int64_t n, int64_t k, int64_t d);             \
  template <class T>                                                                                            \
  void moe_permute_backward(T* dx, const T* dxs, const int32_t* pos, int64_t n, int64_t k, int64_t d);          \
  template <class T>                                                                                            \
  void moe_unpermute_forward(T* y, const T* out, const int32_t* pos, const float* w, int64_t n, int64_t k,      \
                             int64_t d);                                                                        \
  template <class T>                                                                                            \
  void moe_unpermute_backward(T* dout, float* dw, const T* dy, const T* out, const int32_t* pos, const float* w, \
                              int64_t n, int64_t k, int64_t d);
TITAN_FOR_EACH_ISA(TITAN_MOE_PERMUTE_KERNELS)
