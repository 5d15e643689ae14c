// Reference: sparse MLA attention in the absorbed (MQA) form, forward and backward, one
// (query, head) row at a time with plain loops, in acc_t<T> arithmetic. Contract and the
// validity rule: kernels/sparse_mla.h and dsa_params.h; math: docs/dsa.md sections 4 and 5.
#pragma once

#include <cstdint>

#include "titan/kernels/dsa_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// Whether slot value s selects a key for query t (dsa_params.h): 0 <= s <= t + (Skv - S).
inline bool sparse_mla_slot_valid(int32_t s, int64_t t, const SparseMlaParams& d) {
  return s >= 0 && int64_t(s) <= t + (d.Skv - d.S);
}

// o = softmax over the valid selected keys of scale * q . kv, times the first Dv dims of those
// rows; lse is its natural-log normalizer. Rows with no valid slot: o = 0, lse = +inf.
// head_mean (optional, nullptr: not computed) = the head mean of those probabilities per slot,
// 0 for invalid slots (the indexer's sparse-stage KL target, docs/dsa.md 6.2).
template <class T>
void sparse_mla_forward(T* o,                // [B, S, H, Dv]
                        acc_t<T>* lse,       // [B, S, H]
                        acc_t<T>* head_mean,  // [B, S, K] or nullptr
                        const T* q,          // [B, S, H, Dqk]
                        const T* kv,         // [B, Skv, Dqk]
                        const int32_t* idx,  // [B, S, K]
                        const SparseMlaParams& d);

// Overwrites dq and dkv with the gradients of sum(dout * o), P recomputed from q, kv and lse.
template <class T>
void sparse_mla_backward(T* dq,                // [B, S, H, Dqk]
                         T* dkv,               // [B, Skv, Dqk]
                         const T* dout,        // [B, S, H, Dv]
                         const T* q,           // [B, S, H, Dqk]
                         const T* kv,          // [B, Skv, Dqk]
                         const int32_t* idx,   // [B, S, K]
                         const T* o,           // [B, S, H, Dv]
                         const acc_t<T>* lse,  // [B, S, H]
                         const SparseMlaParams& d);

}  // namespace titan::kernels::ref
