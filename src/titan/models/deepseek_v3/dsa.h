// DeepSeek Sparse Attention (DeepSeek-V3.2): the two training stages and the two implementations
// of one MLA layer with its lightning indexer. Math: docs/dsa.md sections 1-6.
//
// Stages (DeepSeek-V3.2-Exp paper, section 2.1):
// - dense_warmup: attention is dense MLA (standard form); the indexer learns to match the head
//   mean of that attention's causal probabilities. The model freezes everything else
//   (Transformer::set_dsa), and the LM loss is still computed and logged.
// - sparse: each query attends only to the top-k keys of the indexer's scores (absorbed MQA form
//   in the fused path); the target is the sparse attention's own probabilities over the selected
//   set, head-averaged. Everything trains; the indexer only from its own loss (its inputs are
//   detached), the rest only from the LM loss (top-k has no gradient, the target is detached).
// Indexer loss of one layer: the mean over the B * S query rows of KL(p || softmax(I)) over the
// row's valid keys; the model's auxiliary loss is indexer_loss_coeff times its sum over layers.
//
// Implementations, chosen by `[model] converters` (models/converters.h):
// - fused ("dsa_fused"): kernels::indexer_topk, sparse_mla_forward/backward and the indexer's
//   KL loss (dense stage: indexer_kl_loss, the flash attention's lse feeds the recomputed target;
//   sparse stage: indexer_kl_loss_sparse, fed the sparse forward's per-slot head_mean).
// - small_ops (default, or "dsa_small_ops" / "small_ops"): the same math from generic differentiable ops (autograd/ops.h): the
//   [B, S, S] index scores and [B, H, S, S] probabilities are materialized, top-k runs on the
//   masked scores, and the sparse attention is dense standard-form MLA with an additive -inf mask
//   built from the selection (what DeepSeek's V3.2 reference does in prefill). The oracle the
//   fused path is checked against.
// Under bf16 compute the fused kernels run in bf16 (the absorbed-form products with wkv_b's f32
// master in f32), and the small-op path casts its inputs to f32 and its output back. Generation
// decodes sparse in the absorbed form with the fused kernels (Attention::forward_absorbed).
#pragma once

#include "titan/autograd/variable.h"

namespace titan::distributed {
class ProcessGroup;
}

namespace titan::models::deepseek_v3 {

using autograd::Variable;

enum class DsaStage { dense_warmup, sparse };
enum class DsaImpl { fused, small_ops };

const char* dsa_stage_name(DsaStage s);

struct DsaConfig {
  DsaStage stage = DsaStage::sparse;
  DsaImpl impl = DsaImpl::small_ops;
  double indexer_loss_coeff = 0.01;  // Megatron-LM's dsa_indexer_loss_coeff in its DSA test
  int64_t topk = 0;                  // keys per query; 0: the flavor's index_topk
};

// One layer's DSA inputs: MLA's pieces (standard form, RoPE applied) and the indexer's outputs.
struct DsaInputs {
  Variable q;       // [B, S, H, d_n + d_r]
  Variable c;       // [B, S, 1, d_c]  kv_norm(latent)
  Variable k_rope;  // [B, S, 1, d_r]  RoPE(k_r), shared by the heads
  Variable wkv_b;   // wkv_b's f32 master weight [H * (d_n + d_v), d_c]
  Tensor wkv_b_compute;  // its bf16 compute copy under mixed precision, else undefined
  Variable index_q;  // [B, S, HI, DI]  indexer query (RoPE and Hadamard applied)
  Variable index_k;  // [B, Skv, DI]  (Skv = S unless kv_keys is given)
  // Context parallelism (fused only): the keys are the latent rows [c | k_rope] of a gathered
  // sequence prefix, [B, Skv, d_c + d_r], and the queries its last S positions; c and k_rope are
  // then not read (the dense warm-up then runs in the absorbed form too). Undefined: the keys are
  // c and k_rope's own S rows.
  Variable kv_keys;
  Variable index_w;  // [B, S, HI] f32, H_I^-0.5 d_I^-0.5 included
  // q, c, k_rope, index_q, index_k share the compute dtype (f32 or bf16).
  int64_t n_heads = 0, nope_dim = 0, rope_dim = 0, v_dim = 0, latent_dim = 0;
  double scale = 0;  // MLA's softmax scale (DeepSeekV3Args::softmax_scale(), in both forms)
  int64_t topk = 0;
  DsaStage stage = DsaStage::sparse;
  bool want_loss = false;  // grad mode: compute the indexer loss
  // Tensor parallelism (fused only): q, wkv_b and the outputs are this rank's n_heads of the
  // layer's tp x n_heads; the indexer is whole on every rank, so its KL target (the head mean of
  // the attention probabilities) is summed over the ranks' heads.
  const distributed::ProcessGroup* tp = nullptr;
};

struct DsaOutputs {
  Variable o;     // [B, S, H, d_v]  per-head attention output (before wo)
  Variable loss;  // one element: the mean KL over query rows; undefined when not wanted
};

DsaOutputs dsa_attention_small_ops(const DsaInputs& in);
DsaOutputs dsa_attention_fused(const DsaInputs& in);

// The indexer's Hadamard rotation (rotate_activation) on the last dim, differentiable: through
// kernels::hadamard_transform (fused) or a GEMM with the explicit matrix (small ops).
Variable hadamard_fused(const Variable& x);
Variable hadamard_small_ops(const Variable& x);

}  // namespace titan::models::deepseek_v3
