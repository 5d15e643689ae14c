// Tensor-level sparse MLA attention in the absorbed (MQA) form, forward and backward: every query
// head attends to the same K selected latent rows of its query (docs/dsa.md sections 4 and 5).
// Dispatches to the fast CPU kernels or, under TITAN_KERNELS=reference, to the reference twin.
// Sizes and the validity rule: dsa_params.h.
//
//   P[t, h, i] = scale * q[t, h] . kv[idx[t, i]]        (all Dqk dims; -inf for invalid slots)
//   lse[t, h] = ln sum_i exp(P[t, h, i])                 (natural log; +inf when no slot is valid)
//   o[t, h]   = sum_i exp(P[t, h, i] - lse[t, h]) kv[idx[t, i], 0:Dv]   (0 when no slot is valid)
// Slot order does not matter. The kernel applies no causal mask beyond the validity rule.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// o [B, S, H, Dv] (q's dtype), lse [B, S, H] f32; q [B, S, H, Dqk], kv [B, Skv, Dqk] (f32 or
// bf16, same dtype), idx [B, S, K] i32. Dv <= Dqk.
// head_mean (optional) [B, S, K] f32 = (1/H) sum_h exp(P[t, h, i] - lse[t, h]) per slot i of idx
// (0 for invalid slots; all 0 in rows with no valid slot): the indexer's sparse-stage KL target
// (docs/dsa.md 6.2), from the probabilities the forward computes anyway. Written only when head_mean
// is non-null.
void sparse_mla_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& idx, int64_t dv,
                        double scale, Tensor* head_mean = nullptr);

// Writes (overwrites) dq [B, S, H, Dqk] and dkv [B, Skv, Dqk] (q's dtype) with the gradients of
// sum(dout * o); probabilities are recomputed from lse. dkv sums the key and value roles of each
// row over every query that selected it (accumulated in f32, without races); rows nobody
// selected are exactly 0. o and lse are the forward's outputs for the same inputs.
void sparse_mla_backward(Tensor& dq, Tensor& dkv, const Tensor& dout, const Tensor& q, const Tensor& kv,
                         const Tensor& idx, const Tensor& o, const Tensor& lse, double scale);

}  // namespace titan::kernels
