// Tensor-level mHC Sinkhorn projection (kernels/ref/sinkhorn.h has the math): logits [..., N, N]
// f32 contiguous -> p of the same shape; backward accumulates (+=) into dlogits and recomputes
// the iterations from the logits (nothing saved but the logits: (2 iters - 1) N^2 floats per
// token less to keep, for about one more forward in backward).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

void sinkhorn_forward(Tensor& p, const Tensor& logits, int iters, double eps);
void sinkhorn_backward(Tensor& dlogits, const Tensor& dp, const Tensor& logits, int iters, double eps);

}  // namespace titan::kernels
