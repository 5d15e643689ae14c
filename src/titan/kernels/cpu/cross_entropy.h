// Fast fused log-softmax cross-entropy (per-ISA variants; see cpu/isa.h). Semantics as
// ref/cross_entropy.h for T in {float, bf16}, f32 statistics. Forward reads each row once, in
// L1-sized vocabulary chunks with an online (rescaled) log-sum-exp; backward reads logits and
// writes dlogits once.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_CROSS_ENTROPY_KERNELS                                                                      \
  template <class T>                                                                                     \
  void cross_entropy_forward(float* loss, float* lse, const T* logits, const int32_t* targets, int64_t n, \
                             int64_t v, int32_t ignore_index);                                           \
  template <class T>                                                                                     \
  void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const float* lse,     \
                              const float* dloss, float scale, int64_t n, int64_t v, int32_t ignore_index);
TITAN_FOR_EACH_ISA(TITAN_CROSS_ENTROPY_KERNELS)
