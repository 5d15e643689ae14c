// Reference: causal softmax attention with grouped-query heads, forward and backward, one query
// row at a time (no S x S matrix), in acc_t<T> arithmetic. Sizes and layouts: see attention_params.h.
#pragma once

#include "titan/kernels/attention_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// o = softmax(scale q k^T + causal mask) v, lse = log-sum-exp of each masked score row.
template <class T>
void attention_forward(T* o,              // [B, S, H, Dv]
                       acc_t<T>* lse,     // [B, H, S]
                       const T* q,        // [B, S, H, Dqk]
                       const T* k,        // [B, S, Hkv, Dqk]
                       const T* v,        // [B, S, Hkv, Dv]
                       const AttentionParams& d);

// dq, dk, dv += gradients of sum(dout * o) with P recomputed from q, k and lse.
template <class T>
void attention_backward(T* dq,                // [B, S, H, Dqk]
                        T* dk,                // [B, S, Hkv, Dqk]
                        T* dv,                // [B, S, Hkv, Dv]
                        const acc_t<T>* lse,  // [B, H, S]
                        const T* dout,        // [B, S, H, Dv]
                        const T* q,           // [B, S, H, Dqk]
                        const T* k,           // [B, S, Hkv, Dqk]
                        const T* v,           // [B, S, Hkv, Dv]
                        const T* o,           // [B, S, H, Dv]
                        const AttentionParams& d);

}  // namespace titan::kernels::ref
