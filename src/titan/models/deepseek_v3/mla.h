// Multi-head latent attention (MLA), DeepSeek-V2/V3. Notation and shapes:
// docs/dsa.md section 1 (d_c = kv_lora_rank, d_n / d_r / d_v = qk_nope / qk_rope
// / v head dims, d_qk = d_n + d_r).
//
//   q      = wq x, or wq_b q_norm(wq_a x)                 per head [d_n | d_r], RoPE on the d_r tail
//   [c | k_r] = wkv_a x                                   c: the latent [d_c], k_r: one rope key [d_r]
//   c      = kv_norm(c);  k_r = RoPE(k_r)                 k_r is shared by all heads
//   [k_n | v] = wkv_b c                                   per head [d_n | d_v]
//   o_h    = softmax(tau q_h . [k_n,h | k_r]) v_h;  out = wo o
//
// RoPE pairs are interleaved (x[2i], x[2i+1]) as in DeepSeek's checkpoints. tau is
// DeepSeekV3Args::softmax_scale() (d_qk^-0.5 times YaRN's mscale^2).
//
// Two forms compute the same function:
// - standard (forward): materializes k [B, S, H, d_qk] and v [B, S, H, d_v] per head; used for
//   training and prefill, and differentiable.
// - absorbed (forward_absorbed): folds wkv_b's key rows into the query and its value rows into the
//   output, so attention runs over one shared (d_c + d_r)-wide latent row per token (MQA with one
//   KV head). This is what the KV cache, decoding and DeepSeek Sparse Attention use.
#pragma once

#include "titan/models/aux_loss.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v3/dsa.h"
#include "titan/models/deepseek_v3/indexer.h"
#include "titan/nn/layers.h"

namespace titan::distributed {
class ProcessGroup;
}

namespace titan::models::deepseek_v3 {

using autograd::Variable;

// The absorbed form's cache: one latent row per token, shared by all heads.
struct LatentCache {
  Tensor kv;      // [B, capacity, 1, d_c + d_r] f32: kv_norm(c) | RoPE(k_r); the attention key
  Tensor latent;  // [B, capacity, 1, d_c] f32: kv_norm(c) again, contiguous, as the value
  Tensor index_k;  // [B, capacity, DI] f32: the lightning indexer's keys (V3.2 only)
  static LatentCache allocate(const DeepSeekV3Args& a, int64_t batch, int64_t capacity);
};

class Attention : public nn::Module, public AppliesRope {
 public:
  // tp: tensor parallelism (null: none): this rank holds heads [r H/tp, (r+1) H/tp) of wq / wq_b,
  // wkv_b and wo; the latent projections, their norms and the indexer are whole on every rank.
  Attention(const DeepSeekV3Args& a, int layer_id, const distributed::ProcessGroup* tp = nullptr);

  // Standard form: x [B, S, D] -> [B, S, D]; positions i32 [B, S]. With an indexer (V3.2) this is
  // DeepSeek Sparse Attention in the stage and implementation of `dsa` (dsa.h), and the indexer's
  // KL loss of the call (when grad mode is on) is appended to aux as "indexer_loss", times
  // dsa.indexer_loss_coeff. Under TP x and the result are this rank's sequence piece
  // [B*S / tp, D]: the tokens are gathered first and the row-parallel wo's partial sums
  // reduce-scattered back.
  Variable forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                   AuxLosses* aux = nullptr) const;

  // Absorbed form (inference: f32, no autograd). x [B, T, D] holds the tokens at positions
  // past .. past + T - 1 (positions i32 [B, T]); their latent rows are written into the cache at
  // [past, past + T) and each attends to the cache rows up to its own. Returns [B, T, D].
  // With an indexer (V3.2) each token attends only to the top-k cached rows by index score
  // (kernels::indexer_topk + sparse_mla_forward) once the context exceeds k, as in sparse
  // training; shorter contexts select every row, so the dense decode is used there.
  Tensor forward_absorbed(const Tensor& x, const kernels::RopeTables& rope, const Tensor& positions,
                          LatentCache& cache, int64_t past) const;

  // q_lora_rank == 0: wq; else wq_a, q_norm, wq_b. The others are always present.
  nn::Linear* wq = nullptr;
  nn::Linear* wq_a = nullptr;
  nn::RMSNorm* q_norm = nullptr;
  nn::Linear* wq_b = nullptr;
  nn::Linear& wkv_a;
  nn::RMSNorm& kv_norm;
  nn::Linear& wkv_b;
  nn::Linear& wo;
  Indexer* indexer = nullptr;  // V3.2 (args.has_indexer()): "indexer"

  DsaConfig dsa;  // set by Transformer::set_dsa
  // Context parallelism (Transformer::set_context_parallel): x and positions hold this rank's
  // chunks of each sequence (distributed/context_parallel.h): dense MLA runs ring attention,
  // DSA's sparse stage gathers the latent rows.
  const distributed::ProcessGroup* cp = nullptr;
  // Async TP (Transformer::set_async_tensor_parallel): the token gather overlaps the first
  // projections' GEMMs and wo's reduce-scatter its own (distributed/async_tensor_parallel.h).
  bool async_tp = false;

 private:
  // What the attention reads of its input x [B, S, D] (every rank's tokens under TP): the first
  // query projection (wq x, or wq_a x when q_lora_rank > 0), the latent projection wkv_a x, and
  // x itself (V3.2's indexer reads it detached). Under async TP gathered_linears computes them
  // while the tokens are gathered.
  struct Projections {
    Variable q, kv;  // [B, S, *]
    Tensor x;        // [B, S, D]; undefined without an indexer
  };
  Projections project(const Variable& x) const;
  // The standard form from the projections of whole sequences: the heads' outputs [B, S, H d_v]
  // before wo (under TP: this rank's heads).
  Variable heads(const Projections& p, const kernels::RopeTables& rope, const Tensor& positions, AuxLosses* aux) const;
  Variable heads_dsa(const Projections& p, const kernels::RopeTables& rope, const Tensor& positions,
                     AuxLosses* aux) const;
  // DSA on this rank's two chunks against the gathered keys (context parallel).
  DsaOutputs dsa_context_parallel(const DsaInputs& in) const;
  // q [B, S, H, d_qk] with RoPE applied to each head's d_r tail, from the first query projection.
  Variable query(const Variable& q_proj, const kernels::RopeTables& rope, const Tensor& positions) const;
  // The same from the query latent qr = q_norm(wq_a x) (q_lora_rank > 0).
  Variable query_from_latent(const Variable& qr, const kernels::RopeTables& rope, const Tensor& positions) const;
  // wkv_a x with RoPE on the k_r tail: [B, S, 1, d_c + d_r] (the latent is not normed yet).
  Variable latent_kv(const Variable& kv_proj, const kernels::RopeTables& rope, const Tensor& positions) const;

  int64_t n_heads() const { return wo.weight.var.shape()[1] / v_dim_; }  // this rank's, as the plan placed wo
  int64_t kv_lora_rank_, qk_nope_, qk_rope_, v_dim_, index_topk_;
  int64_t dim_;
  double scale_;
  const distributed::ProcessGroup* tp_;
};

}  // namespace titan::models::deepseek_v3
