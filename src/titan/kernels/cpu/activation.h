// Fast SiLU and SwiGLU, forward and backward (per-ISA variants; see cpu/isa.h). Semantics and
// shapes as in ref/activation.h (limit: SwiGLU's clamp, infinite for none); T is float or bf16,
// math in f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_ACTIVATION_KERNELS                                                                  \
  template <class T> void silu_forward(T* y, const T* x, int64_t n);                              \
  template <class T> void silu_backward(T* dx, const T* dy, const T* x, int64_t n);               \
  template <class T> void swiglu_forward(T* y, const T* gate, const T* up, int64_t n, float limit); \
  template <class T>                                                                              \
  void swiglu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n, bool accumulate, \
                       float limit);
TITAN_FOR_EACH_ISA(TITAN_ACTIVATION_KERNELS)
