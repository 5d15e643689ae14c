// Reference: attention of Sq queries over Skv keys with no mask (grouped-query heads), forward and
// backward, one query row at a time, in acc_t<T> arithmetic. Sizes and layouts:
// UnmaskedAttentionParams (attention_params.h).
#pragma once

#include "titan/kernels/attention_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// o = softmax(scale q k^T) v, lse = log-sum-exp of each scaled score row.
template <class T>
void attention_unmasked_forward(T* o,           // [B, Sq, H, Dv]
                                acc_t<T>* lse,  // [B, H, Sq]
                                const T* q,     // [B, Sq, H, Dqk]
                                const T* k,     // [B, Skv, Hkv, Dqk]
                                const T* v,     // [B, Skv, Hkv, Dv]
                                const UnmaskedAttentionParams& d);

// dq, dk, dv += the gradients of sum(dout * o) where o and lse may be the merged result of
// several blocks (ring attention): P = exp(scale q k^T - lse), dS = P (dout v^T - D) with
// D = rowsum(dout * o), the standard flash-attention backward of this block's share.
template <class T>
void attention_unmasked_backward(T* dq,                // [B, Sq, H, Dqk]
                                 T* dk,                // [B, Skv, Hkv, Dqk]
                                 T* dv,                // [B, Skv, Hkv, Dv]
                                 const acc_t<T>* lse,  // [B, H, Sq]
                                 const T* dout,        // [B, Sq, H, Dv]
                                 const T* q, const T* k, const T* v,
                                 const T* o,  // [B, Sq, H, Dv]
                                 const UnmaskedAttentionParams& d);

}  // namespace titan::kernels::ref
