// mHC's ops (DeepSeek-V4's hyper-connections; kernels/hyper_connection.h), f32, tokens flattened:
//   hc_weights:  mix [T, (N + 2) N], base [(N + 2) N], scale [3] -> [T, (N + 2) N] packed as
//                pre = sigmoid(.) + eps (N), post = 2 sigmoid(.) (N), Sinkhorn logits (N^2);
//                or the HyperHead's mix [T, N], base [N], scale [1] -> pre
//   hc_collapse: x [T, N, d], pre [T, N] -> u = sum_j pre_j x_j [T, d]
//   hc_expand:   x [T, N, d], a [T, d], post [T, N], comb [T, N, N] -> post_k a + sum_j comb[j, k] x_j
// Each saves its inputs (small beside the streams they read) and recomputes nothing.
#pragma once

#include "titan/autograd/variable.h"

namespace titan::autograd {

Variable hc_weights(const Variable& mix, const Variable& base, const Variable& scale, int64_t n, double eps);
Variable hc_collapse(const Variable& x, const Variable& pre);
Variable hc_expand(const Variable& x, const Variable& a, const Variable& post, const Variable& comb);

}  // namespace titan::autograd
