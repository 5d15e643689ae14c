// The blocks of ring attention (distributed/ring_attention.h): attention of Sq queries over Skv
// keys with no mask (a key block that lies wholly before the query block), forward with the
// log-sum-exp, backward from a merged output, and the log-sum-exp merge of partial results.
// The fast path tiles the scores (64 queries x 256 keys) and runs their products as GEMMs
// (kernels/matmul.h) on one thread per (batch, head, query tile); kernels/ref/attention_unmasked.h
// is its twin.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// o = softmax(scale q k^T) v; lse = log-sum-exp of each scaled score row. q [B, Sq, H, Dqk],
// k [B, Skv, Hkv, Dqk], v [B, Skv, Hkv, Dv] (H % Hkv == 0), o [B, Sq, H, Dv] of q's dtype,
// lse [B, H, Sq] f32. f32 or bf16, contiguous; bf16 multiplies with f32 accumulation and rounds
// the probabilities to bf16 as the operand of P v (as the causal kernels do).
void attention_unmasked_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                                double scale);

// dq, dk, dv += this block's share of the gradients of sum(dout * o), where o [B, Sq, H, Dv] and
// lse [B, H, Sq] are the final (merged) attention output over every block the queries attend to.
// The gradients have the inputs' dtype, or f32 (bf16 inputs then add into f32 sums, rounding
// once at the end of a ring rather than at every block).
void attention_unmasked_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& lse, const Tensor& dout,
                                 const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, double scale);

// Merges a partial result into a running one by log-sum-exp: o [B, L, H, Dv] f32 and lse
// [B, H, L] f32 hold attention over some keys (lse = -inf: none yet); o_part [B, Lp, H, Dv] (f32 or
// bf16) and lse_part [B, H, Lp] the same rows [row0, row0 + Lp) over other keys. Afterwards o and
// lse are the attention over both key sets.
void attention_merge(Tensor& o, Tensor& lse, const Tensor& o_part, const Tensor& lse_part, int64_t row0);

}  // namespace titan::kernels
