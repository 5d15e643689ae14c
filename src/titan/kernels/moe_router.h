// MoE routing in f32 (semantics: ref/moe_router.h): scores, the biased group-limited top-k
// choice of experts and the gate weights; their backward; the sequence-wise balance loss.
// Routing is O(N E) next to the experts' O(N k D F) GEMMs, so the fast path is the reference's
// row loop run on every thread over disjoint token chunks (same results bit for bit).
#pragma once

#include "titan/core/tensor.h"
#include "titan/kernels/moe_router_params.h"

namespace titan::kernels {

// Throws unless p is a valid routing setup (top_k, groups); the error says what to change.
void check_router_params(const RouterParams& p);

// scores [N, E], weights [N, k] f32 and indices [N, k] i32 from logits [N, E] f32; bias [E] f32
// (aux-loss-free balancing) or undefined.
void moe_router_forward(Tensor& scores, Tensor& indices, Tensor& weights, const Tensor& logits, const Tensor& bias,
                        const RouterParams& p);

// Hash routing (DeepSeek-V4's hash_moe layers): the choice is given, indices [N, k] i32 (a token
// id's row of tid2eid; an expert may repeat within a row), so only scores [N, E] and weights
// [N, k] are computed, as moe_router_forward computes them. Its backward is moe_router_backward.
void moe_router_weights_forward(Tensor& scores, Tensor& weights, const Tensor& logits, const Tensor& indices,
                                const RouterParams& p);

// dlogits [N, E] (f32) += the gradient through the gate weights (dweights [N, k]) and, when
// defined, an extra gradient on the scores (dscores [N, E], from the balance loss).
void moe_router_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& dscores, const Tensor& scores,
                         const Tensor& indices, const RouterParams& p);

// The sequence-wise balance loss (no coefficient) over scores of `batch` sequences of N / batch
// tokens each, and its backward: dscores [N, E] += dloss * d loss / d scores.
double moe_aux_loss_forward(const Tensor& scores, const Tensor& indices, int64_t batch, const RouterParams& p);
void moe_aux_loss_backward(Tensor& dscores, double dloss, const Tensor& scores, const Tensor& indices, int64_t batch,
                           const RouterParams& p);

}  // namespace titan::kernels
