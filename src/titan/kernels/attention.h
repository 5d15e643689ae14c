// Tensor-level causal attention in flash form (streaming softmax with log-sum-exp, GQA, never an
// S x S score matrix), forward and backward. Dispatches to the fast CPU kernels or, under
// TITAN_KERNELS=reference, to the reference twin.
#pragma once

#include <optional>

#include "titan/core/tensor.h"
#include "titan/kernels/attention_params.h"

namespace titan::kernels {

// Dqk^-0.5, the usual softmax scale. MLA passes its own: YaRN's mscale enlarges it.
double default_attention_scale(int64_t head_dim);

// o = softmax(scale q k^T + causal mask) v; lse = log-sum-exp of each masked, scaled score row
// (saved for the backward). q [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv] (H % Hkv == 0),
// o [B, S, H, Dv] of q's dtype, lse [B, H, S] f32. f32 or bf16, contiguous. scale defaults to
// Dqk^-0.5.
// bf16 on CPUs with AMX (Dqk and Dv multiples of 32) multiplies on AMX tiles with f32
// accumulation; the softmax stays f32, but the probabilities P (and in the backward dS) are
// rounded to bf16 as operands of P v (dO^T P, dS k, q^T dS), as in other bf16 flash attentions.
// Elsewhere bf16 is widened to f32. Both agree with the reference within bf16 tolerances.
void attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       std::optional<double> scale = std::nullopt);

// dq, dk, dv += gradients of sum(dout * o) (accumulates, so callers zero them first or sum
// several contributions). o and lse are the forward's outputs for the same q, k, v and scale.
void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& lse, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& o, std::optional<double> scale = std::nullopt);

// MLA's attention without per-head keys and values in memory: head h's key is
// [kv[..., h, :Dn] | k_rope[..., 0, :]] (the rope key shared by all heads), its value
// kv[..., h, Dn:]. q [B, S, H, Dn + Dr], kv [B, S, H, Dn + Dv], k_rope [B, S, 1, Dr], o and lse as
// in attention_forward. Equals attention_forward on the assembled keys and values; f32 with the
// fast kernels reads them in place, other cases assemble them and call attention_forward.
void mla_attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                           int64_t nope_dim, std::optional<double> scale = std::nullopt);

// dq, dkv, dk_rope += the gradients of sum(dout * o) (accumulates, like attention_backward); the
// shared rope key's gradient sums over heads. accumulate = false stores them instead (=), so that
// fresh gradient buffers need no zero-fill.
void mla_attention_backward(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& lse, const Tensor& dout,
                            const Tensor& q, const Tensor& kv, const Tensor& k_rope, const Tensor& o, int64_t nope_dim,
                            std::optional<double> scale = std::nullopt, bool accumulate = true);

}  // namespace titan::kernels
