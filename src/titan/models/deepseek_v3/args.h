// DeepSeek-V3 model arguments and the named flavors (TorchTitan v0.2's deepseekv3_args).
// Field names follow DeepSeek's inference/model.py ModelArgs, which TorchTitan copied.
#pragma once

#include <string>
#include <vector>

#include "titan/kernels/rope.h"

namespace titan::models::deepseek_v3 {

enum class ScoreFunc { softmax, sigmoid };  // MoE router gate activation

struct DeepSeekV3Args {
  int64_t dim = 256;
  int64_t n_layers = 6;
  int64_t n_dense_layers = 1;  // layers [0, n_dense_layers) use the dense FFN, the rest MoE
  int64_t n_heads = 16;
  int64_t vocab_size = 2048;
  int64_t inter_dim = 1024;     // dense SwiGLU hidden size
  int64_t moe_inter_dim = 256;  // hidden size of each routed and shared expert
  double norm_eps = 1e-5;

  // MoE: read by the MoE layer (models/moe); here they size the analytic parameter count and
  // the Hugging Face config.
  int64_t n_routed_experts = 8;
  int64_t n_shared_experts = 2;
  int64_t n_activated_experts = 3;  // top-k
  ScoreFunc score_func = ScoreFunc::softmax;
  int64_t n_expert_groups = 1;  // node-limited routing: groups, and groups a token may use
  int64_t n_limited_groups = 1;
  double route_scale = 1.0;
  bool route_norm = false;  // renormalize the top-k gate weights to sum 1
  // Balancing (set from [model] moe_load_balance_coeff / moe_aux_loss_alpha, not by the flavor):
  // the aux-loss-free bias update rate and the sequence-wise auxiliary loss weight.
  double load_balance_coeff = 1e-3;
  double aux_loss_alpha = 0;

  // Multi-head latent attention.
  int64_t q_lora_rank = 0;  // 0: a plain wq projection; > 0: wq_a -> q_norm -> wq_b
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;

  // YaRN (DeepSeek's reference applies it, and the mscale^2 softmax factor, only when
  // max_seq_len > original_seq_len).
  int64_t max_seq_len = 4096 * 4;  // RoPE table length
  int64_t original_seq_len = 4096;
  double rope_theta = 10000;
  double rope_factor = 40;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0;

  // DeepSeek Sparse Attention (V3.2): the lightning indexer of every layer (index_n_heads = 0: none,
  // plain DeepSeek-V3). Names as in DeepSeek's ModelArgs and Hugging Face's config.json.
  int64_t index_n_heads = 0;     // H_I
  int64_t index_head_dim = 128;  // d_I; its first qk_rope_head_dim dims get (rotate-half) RoPE
  int64_t index_topk = 2048;     // keys each query attends to in the sparse stage
  bool index_hadamard = true;    // rotate_activation on indexer q and k (score-preserving)
  bool has_indexer() const { return index_n_heads > 0; }

  // Multi-token prediction (DeepSeek-V3 section 2.2; mtp.h): D sequential modules, each a full
  // block after the main layers (layer ids n_layers .. n_layers + D - 1, MoE or dense by the same
  // n_dense_layers rule), adding mtp_loss_weight / D * sum_k L_k to the training loss. The
  // flavors have none (as TorchTitan's); DeepSeek-V3's checkpoint has 1 (num_nextn_predict_layers).
  int64_t num_mtp_layers = 0;    // D
  double mtp_loss_weight = 0.3;  // lambda (the paper's first 10T tokens; 0.1 after)

  bool depth_init = true;  // output projections' init std shrinks with depth (TorchTitan)

  // TorchTitan's init: projections trunc_normal(0.02); the output projections of layer l (wo,
  // w2, w3) 0.02 / sqrt(2 (l + 1)) under depth_init, else 0.02 / sqrt(2 n_layers).
  static constexpr double kInitStd = 0.02;
  // The lightning indexer's LayerNorm on its key (DeepSeek's reference: nn.LayerNorm default).
  static constexpr double kIndexerNormEps = 1e-6;
  double out_proj_std(int layer_id) const;

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool yarn() const { return max_seq_len > original_seq_len; }
  kernels::RopeConfig rope() const;  // over the qk_rope_head_dim tail of each head
  double softmax_scale() const;      // qk_head_dim^-0.5, times mscale^2 under YaRN
  // Layer ids n_layers .. n_layers + num_mtp_layers - 1 are the MTP modules' blocks.
  bool is_moe_layer(int64_t layer) const { return layer >= n_dense_layers; }

  // Analytic parameter counts of the full architecture (MoE layers with all their experts). The
  // MTP modules are counted apart, as DeepSeek's 671B excludes its 14B MTP module (embedding
  // and head included there; here they are shared, so mtp holds only the modules' own weights).
  struct ParamCount {
    int64_t total = 0;
    int64_t active = 0;     // per token: routed experts count top_k / n_routed_experts
    int64_t embedding = 0;  // the input table (the output projection is counted as dense)
    int64_t mtp = 0;        // the MTP modules' own parameters (not in total)
    int64_t mtp_active = 0;
    int64_t indexer = 0;  // one layer's lightning indexer (in total and active; 0 without one)
  };
  ParamCount parameters() const;
  // Training FLOPs per token, as TorchTitan counts them: 6 * (active - embedding) + 6 * L * H *
  // (qk_nope + qk_rope + v) * S, plus the indexer's scores 6 * L * H_I * d_I * S when it has one
  // (the attention term stays the dense one: an upper bound in the sparse stage); with MTP, each
  // module adds its active weights, one more pass through the shared output head and its block's
  // attention (and indexer) terms.
  double training_flops_per_token(int64_t seq_len) const;
  // The same for DeepSeek-V3.2's stages: attention over `keys` keys per query instead of seq_len
  // (the sparse stage's top-k), and with `main_frozen` (the dense warm-up) everything outside the
  // indexers runs forward only (2 FLOPs per weight, a third of the attention term) while the
  // indexers still train (6 per weight, their full score term).
  double training_flops_per_token(int64_t seq_len, int64_t keys, bool main_frozen) const;
  void validate() const;  // throws naming the field when the shapes do not fit together
};

// Flavors: "debugmodel", "100M", "16B", "236B", "671B". vocab_size comes from the tokenizer (the
// flavor's own is used when vocab_size <= 0). Throws, listing the flavors, for an unknown name.
DeepSeekV3Args deepseek_v3_flavor(const std::string& flavor, int64_t vocab_size = 0);
std::vector<std::string> deepseek_v3_flavor_names();

// DeepSeek-V3.2 flavors ("debugmodel", "671B"): the V3 flavor of the same name plus the lightning
// indexer of every layer (q_lora_rank > 0, which the indexer's query reads).
DeepSeekV3Args deepseek_v32_flavor(const std::string& flavor, int64_t vocab_size = 0);
std::vector<std::string> deepseek_v32_flavor_names();

}  // namespace titan::models::deepseek_v3
