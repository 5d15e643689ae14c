// Reference: MoE routing (semantics of kernels/moe_router.h) over rows of tokens.
//
//   scores = softmax(logits), sigmoid(logits) or sqrt(softplus(logits))  [N, E]
//   choice = top_k of (scores + bias), within the best topk_groups groups (group-limited),
//            or given (hash routing: router_weights_forward; an expert may repeat)
//   weights = scores[choice], / their sum if route_norm, * route_scale  [N, k]
//
// The bias only steers the choice: gradients flow from the weights to the scores to the logits,
// never through the (discrete) choice. Ties rank the lower expert (or group) index first, so the
// choice is deterministic. T is float (the router runs in f32) or double (gradient checks).
#pragma once

#include <cstdint>

#include "titan/kernels/moe_router_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

template <class T>
void router_forward(T* scores,         // [N, E]
                    int32_t* indices,  // [N, k], descending biased score
                    T* weights,        // [N, k]
                    const T* logits,   // [N, E]
                    const T* bias,     // [E] or nullptr (no bias)
                    int64_t n, const RouterParams& p);

// scores and weights for a given choice (hash routing).
template <class T>
void router_weights_forward(T* scores,               // [N, E]
                            T* weights,              // [N, k]
                            const T* logits,         // [N, E]
                            const int32_t* indices,  // [N, k], in [0, E)
                            int64_t n, const RouterParams& p);

// dlogits += d(weights -> logits) dweights + d(scores -> logits) dscores. dscores is an extra
// gradient on the scores (the auxiliary loss's), or nullptr.
template <class T>
void router_backward(T* dlogits,              // [N, E]
                     const T* dweights,       // [N, k]
                     const T* dscores,        // [N, E] or nullptr
                     const T* scores,         // [N, E]
                     const int32_t* indices,  // [N, k]
                     int64_t n, const RouterParams& p);

// DeepSeek-V3's sequence-wise balance loss, without its coefficient, averaged over sequences:
//   per sequence of S tokens: sum_i f_i * P_i with f_i = E / (k S) * (tokens choosing i) and
//   P_i = mean over the tokens of scores[t, i] / sum_j scores[t, j].
// Rows are [batch, S] tokens in order.
template <class T>
acc_t<T> router_aux_loss(const T* scores, const int32_t* indices, int64_t batch, int64_t seq, const RouterParams& p);

// dscores [N, E] += dloss * d(aux loss)/d(scores); the counts f_i are constants (a selection).
template <class T>
void router_aux_loss_backward(T* dscores, acc_t<T> dloss, const T* scores, const int32_t* indices, int64_t batch,
                              int64_t seq, const RouterParams& p);

}  // namespace titan::kernels::ref
