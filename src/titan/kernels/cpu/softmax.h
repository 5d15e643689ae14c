// Fast softmax over the last dim, forward and backward (per-ISA variants; see cpu/isa.h).
// Semantics and shapes as in ref/softmax.h; T is float or bf16, math in f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_SOFTMAX_KERNELS                                                                   \
  template <class T> void softmax_forward(T* y, const T* x, int64_t N, int64_t D);              \
  template <class T> void softmax_backward(T* dx, const T* dy, const T* y, int64_t N, int64_t D);
TITAN_FOR_EACH_ISA(TITAN_SOFTMAX_KERNELS)
