// Fast RMSNorm and LayerNorm, forward and backward (per-ISA variants; see cpu/isa.h). Semantics
// and shapes as in ref/norm.h; T is float or bf16; weights, statistics and weight gradients f32.
// Weight gradients are bit-identical for any thread count (see cpu/norm.cpp).
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_NORM_KERNELS                                                                                    \
  template <class T>                                                                                          \
  void rmsnorm_forward(T* y, float* rstd, const T* x, const float* w, int64_t N, int64_t D, float eps);       \
  template <class T>                                                                                          \
  void rmsnorm_backward(T* dx, float* dw, const float* rstd, const T* dy, const T* x, const float* w,         \
                        int64_t N, int64_t D);                                                                \
  template <class T>                                                                                          \
  void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b,          \
                         int64_t N, int64_t D, float eps);                                                    \
  template <class T>                                                                                          \
  void layernorm_backward(T* dx, float* dw, float* db, const float* mean, const float* rstd, const T* dy,     \
                          const T* x, const float* w, int64_t N, int64_t D);
TITAN_FOR_EACH_ISA(TITAN_NORM_KERNELS)
