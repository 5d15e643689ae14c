// Tensor-level DeepSeek-V4 attention over [sliding window of raw keys | compressed entries | sink],
// forward and backward, fused: no S x S (or S x T) matrix is ever formed; each query's scores
// live in its thread's tile. Dispatches to the fast CPU kernels (cpu/v4_attention.h) or, under
// TITAN_KERNELS=reference, to the reference twin (ref/v4_attention.h). The math is transformers'
// DeepseekV4Attention (../shared/reference/v4_transformers.md 3.3, 3.4, 3.6); sizes and the
// visibility rules: v4_attention_params.h.
//
// Tensors (V4 has one shared K = V latent head: MQA with K = V; partial RoPE is already applied
// by the caller to q, kv and the compressed entries, and de-rotating o is the caller's too):
//   q    [B, S, H, D]  f32 or bf16 (queries, after the per-head RMSNorm and RoPE)
//   kv   [B, Skv, D]   q's dtype (the raw keys and values; Skv >= S, the queries being the last S
//                      rows: on one rank Skv = S, a context-parallel chunk prepends its window's
//                      W - 1 rows from before it)
//   comp [B, T, D]     q's dtype (the compressed entries from position 0, T <= floor((P0 + S) / m);
//                      T = 0: sliding-only)
//   idx  [B, S, K] i32 (CSA: the indexer's top-k entries per query) or undefined (HCA)
//   sink [H] f32 or undefined (no sink)
//   o    [B, S, H, D]  q's dtype;  lse [B, S, H] f32
// Keys of query t (window W, ratio m; r = t + Skv - S its own row, p = P0 + t its global position,
// P0 = pos0 the position of query 0, 0 on one rank):
//   raw key row j  iff r - W < j <= r                                (always including t itself)
//   HCA entry w    iff w < floor((p + 1) / m)                        (every causally visible entry)
//   CSA entry w    iff w = idx[b, t, i] for some i and 0 <= w < floor((p + 1) / m)  (others dropped)
// An entry whose pooled window overlaps the sliding window stays (transformers does not remove it).
// Formula, per (b, t, h), with K_t the keys above (rows of kv and comp):
//   z_j = scale q[t, h] . key_j;   lse = ln(sum_{j in K_t} exp(z_j) + exp(sink_h))
//   o[t, h] = sum_{j in K_t} exp(z_j - lse) key_j        (the sink's probability is dropped)
// Backward (P recomputed from lse; Delta = rowsum(dO * O)):
//   dz_j = P_j (dO . key_j - Delta);  dq = scale sum_j dz_j key_j
//   dkey_j += scale dz_j q + P_j dO   (K = V: key and value roles summed into one row of dkv / dcomp)
//   dsink_h = -sum_{b, t} exp(sink_h - lse) Delta
// CSA slot lists should hold distinct entries (a repeated entry counts once per slot).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// Writes o and lse. window >= 1, ratio >= 2, scale finite and nonzero (V4: D^-0.5).
// head_mean (optional, CSA only) [B, S, K] f32: the CSA indexer's KL target, V3.2's sparse-stage
// target (docs/dsa.md 6.2) restricted to the compressed entries: per valid slot i,
//   (1/H) sum_h exp(z_{h,i}) / sum_{valid slots i'} exp(z_{h,i'})
// (each head's softmax over the selected entries alone: no window keys, no sink); 0 for invalid
// slots and in rows with no valid slot. From the scores the forward computes anyway.
void v4_attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& comp,
                          const Tensor& idx, const Tensor& sink, int64_t window, int64_t ratio, double scale,
                          Tensor* head_mean = nullptr, int64_t pos0 = 0);

// Writes (overwrites) dq, dkv [B, Skv, D], dcomp [B, T, D] (q's dtype) and, when sink is defined,
// dsink [H] f32 with the gradients of sum(dout * o); keys nobody sees get exactly 0. o and lse are
// the forward's outputs for the same inputs.
void v4_attention_backward(Tensor& dq, Tensor& dkv, Tensor& dcomp, Tensor& dsink, const Tensor& dout, const Tensor& q,
                           const Tensor& kv, const Tensor& comp, const Tensor& idx, const Tensor& sink, const Tensor& o,
                           const Tensor& lse, int64_t window, int64_t ratio, double scale, int64_t pos0 = 0);

}  // namespace titan::kernels
