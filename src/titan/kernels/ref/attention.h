// Reference: softmax attention with grouped-query heads, causal or with no mask (Sq queries over
// Skv other keys: ring attention's off-diagonal blocks), forward and backward, one query row at a
// time (no S x S matrix), in acc_t<T> arithmetic. Sizes and layouts: see attention_params.h.
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

// o = softmax(scale q k^T) v over every key, lse = log-sum-exp of each scaled score row.
template <class T>
void attention_unmasked_forward(T* o,           // [B, Sq, H, Dv]
                                acc_t<T>* lse,  // [B, H, Sq]
                                const T* q,     // [B, Sq, H, Dqk]
                                const T* k,     // [B, Skv, Hkv, Dqk]
                                const T* v,     // [B, Skv, Hkv, Dv]
                                const UnmaskedAttentionParams& d);

// dq, dk, dv += the gradients of sum(dout * o), where o and lse may be the merged result of
// several blocks (ring attention): P = exp(scale q k^T - lse), dS = P (dout v^T - D) with
// D = rowsum(dout * o), the standard flash-attention backward of this block's share. The
// gradients G are T, or float with bf16 inputs.
template <class T, class G = T>
void attention_unmasked_backward(G* dq, G* dk, G* dv, const acc_t<T>* lse, const T* dout, const T* q, const T* k,
                                 const T* v, const T* o, const UnmaskedAttentionParams& d);

}  // namespace titan::kernels::ref
