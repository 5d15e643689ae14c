// Fast mHC Sinkhorn projection, forward and backward (per-ISA variants; see cpu/isa.h). Semantics
// and shapes as in ref/sinkhorn.h; f32 (mHC runs in f32). Backward recomputes the iterations.
#pragma once

#include <cstdint>

#include "titan/kernels/dispatch.h"

#define TITAN_SINKHORN_KERNELS                                                                              \
  void sinkhorn_forward(float* p, const float* logits, int64_t tokens, int64_t n, int iters, double eps);   \
  void sinkhorn_backward(float* dlogits, const float* dp, const float* logits, int64_t tokens, int64_t n,    \
                         int iters, double eps);
TITAN_FOR_EACH_ISA(TITAN_SINKHORN_KERNELS)
