// Reference: DeepSeek-V4's attention over [sliding window of raw keys | compressed entries | sink],
// forward and backward, one (query, head) row at a time with plain loops in acc_t<T> arithmetic.
// Contract: kernels/v4_attention.h; which keys a query sees: v4_attention_params.h.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"
#include "titan/kernels/v4_attention_params.h"

namespace titan::kernels::ref {

// o = softmax over [visible keys | sink] of [scale q . key | sink_h], the sink's probability
// dropped, times the keys (K = V); lse its natural-log normalizer (the sink included).
// sink nullptr: no sink term. idx nullptr: HCA (every visible entry), else CSA slots.
// head_mean (CSA only; nullptr: not computed) = per valid slot, the head mean of each head's
// softmax restricted to the valid slots (no window, no sink): the indexer's KL target; 0 for
// invalid slots and in rows without a valid slot.
template <class T>
void v4_attention_forward(T* o,                   // [B, S, H, D]
                          acc_t<T>* lse,          // [B, S, H]
                          acc_t<T>* head_mean,    // [B, S, K] or nullptr
                          const T* q,             // [B, S, H, D]
                          const T* kv,            // [B, Skv, D]
                          const T* comp,          // [B, T, D]
                          const int32_t* idx,     // [B, S, K] or nullptr
                          const acc_t<T>* sink,   // [H] or nullptr
                          const V4AttentionParams& d);

// Overwrites dq, dkv, dcomp and dsink (when sink is given) with the gradients of sum(dout * o),
// the probabilities recomputed from lse.
template <class T>
void v4_attention_backward(T* dq,                  // [B, S, H, D]
                           T* dkv,                 // [B, Skv, D]
                           T* dcomp,               // [B, T, D]
                           acc_t<T>* dsink,        // [H] (ignored without sink)
                           const T* dout,          // [B, S, H, D]
                           const T* q,             // [B, S, H, D]
                           const T* kv,            // [B, Skv, D]
                           const T* comp,          // [B, T, D]
                           const int32_t* idx,     // [B, S, K] or nullptr
                           const acc_t<T>* sink,   // [H] or nullptr
                           const T* o,             // [B, S, H, D]
                           const acc_t<T>* lse,    // [B, S, H]
                           const V4AttentionParams& d);

}  // namespace titan::kernels::ref
