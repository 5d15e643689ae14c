// Tensor-level mHC maps (kernels/ref/hyper_connection.h has the math): f32 contiguous tensors,
// tokens flattened (T = B S). The reference loops run over token ranges on every thread: per
// token they are O(N d) multiply-adds beside the O(N^2 d) GEMM that makes the mixes.
//   weights:  mix [T, M], base [M], scale [3] -> w [T, M] (pre | post | Sinkhorn logits), M = (N + 2) N;
//             the HyperHead's M = N, scale [1]: pre only
//   collapse: x [T, N, d], pre [T, N] -> u [T, d]
//   expand:   x [T, N, d], a [T, d], post [T, N], comb [T, N, N] -> y [T, N, d]
// Backward entries add (+=) into the gradients that are defined.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

void hc_weights_forward(Tensor& w, const Tensor& mix, const Tensor& base, const Tensor& scale, int64_t n, double eps);
void hc_weights_backward(Tensor& dmix, Tensor& dbase, Tensor& dscale, const Tensor& dw, const Tensor& mix,
                         const Tensor& base, const Tensor& scale, int64_t n);

void hc_collapse_forward(Tensor& u, const Tensor& x, const Tensor& pre);
void hc_collapse_backward(Tensor& dx, Tensor& dpre, const Tensor& du, const Tensor& x, const Tensor& pre);

void hc_expand_forward(Tensor& y, const Tensor& x, const Tensor& a, const Tensor& post, const Tensor& comb);
void hc_expand_backward(Tensor& dx, Tensor& da, Tensor& dpost, Tensor& dcomb, const Tensor& dy, const Tensor& x,
                        const Tensor& a, const Tensor& post, const Tensor& comb);

}  // namespace titan::kernels
