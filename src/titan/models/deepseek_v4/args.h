// DeepSeek-V4 model arguments (transformers' DeepseekV4Config, ../shared/reference/
// v4_transformers.md section 1), the named flavors, and the Hugging Face config.json both ways.
// Field names follow transformers' keys where the model reads them as they are; each comment
// names the key.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/kernels/moe_router_params.h"
#include "titan/kernels/rope.h"
#include "titan/models/deepseek_v4/hyper_connection.h"

namespace titan::models::deepseek_v4 {

// Attention of a layer: every layer has the sliding window; CSA adds the indexer's top-k
// compressed entries (ratio csa_ratio), HCA every causally visible entry (ratio hca_ratio).
enum class LayerType { sliding, csa, hca };
// Routing of a layer's MoE: learned top-k, or the frozen token-id table (hash).
enum class MlpType { moe, hash_moe };

const char* layer_type_name(LayerType t);  // transformers' names: "sliding_attention", ...
const char* mlp_type_name(MlpType t);      // "moe", "hash_moe"

struct DeepSeekV4Args {
  int64_t vocab_size = 2048;
  int64_t dim = 64;           // hidden_size, d
  int64_t n_layers = 5;       // num_hidden_layers
  int64_t n_heads = 4;        // num_attention_heads, H (one shared key/value head)
  int64_t head_dim = 64;      // head_dim, D: query, key/value and compressor width
  int64_t rope_dim = 16;      // D * partial_rotary_factor: RoPE on each head's last rope_dim dims
  int64_t q_lora_rank = 32;   // Rq
  int64_t o_groups = 2;       // G
  int64_t o_lora_rank = 16;   // Ro
  double norm_eps = 1e-6;     // rms_norm_eps (every RMSNorm, the unweighted ones too)

  // MoE: every layer's FFN (one shared expert always).
  int64_t n_routed_experts = 8;     // E
  int64_t n_activated_experts = 2;  // num_experts_per_tok, K
  int64_t moe_inter_dim = 32;       // moe_intermediate_size, F: routed and shared experts
  double route_scale = 1.5;         // routed_scaling_factor
  kernels::RouterScore score_func = kernels::RouterScore::sqrtsoftplus;  // scoring_func (or sigmoid)
  double swiglu_limit = 10.0;
  // Aux-loss-free balancing of the learned layers' expert_bias: [model] moe_load_balance_coeff (not
  // in config.json; transformers trains no bias). Hash layers have no bias.
  double load_balance_coeff = 1e-3;

  // mHC residual streams.
  int64_t hc_mult = 4;  // N
  int hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;

  // Attention over [sliding window | compressed entries | sink].
  int64_t sliding_window = 16;  // W raw keys, the query's own included
  int64_t csa_ratio = 4;        // compress_rates["compressed_sparse_attention"], m
  int64_t hca_ratio = 8;        // compress_rates["heavily_compressed_attention"], m'
  int64_t index_n_heads = 8;    // nI (CSA's lightning indexer)
  int64_t index_head_dim = 32;  // dI
  int64_t index_topk = 4;       // compressed entries each query attends to in a CSA layer

  // RoPE: sliding-only layers use rope_theta; CSA / HCA layers use compress_rope_theta with YaRN
  // when the config has it (attention_factor 1: no magnitude scaling).
  double rope_theta = 10000;
  double compress_rope_theta = 160000;
  bool yarn = false;
  double yarn_factor = 1;
  int64_t yarn_original_max_position = 0;
  double yarn_beta_fast = 32, yarn_beta_slow = 1;
  int64_t max_seq_len = 128;  // RoPE tables' length

  // Multi-token prediction (mtp.h; [model] mtp_layers and mtp_loss_weight, not config.json's):
  // D modules after the main layers, each adding mtp_loss_weight / D times its loss.
  int64_t num_mtp_layers = 0;    // D
  double mtp_loss_weight = 0.3;  // lambda

  std::vector<LayerType> layer_types;  // n_layers entries
  std::vector<MlpType> mlp_types;      // n_layers entries
  double init_std = 0.02;              // initializer_range

  int64_t compress_ratio(LayerType t) const { return t == LayerType::csa ? csa_ratio : t == LayerType::hca ? hca_ratio : 0; }
  kernels::RopeConfig rope(LayerType t) const;  // the layer's RoPE over the rope_dim tail
  HyperConnectionArgs hyper_connection() const;
  // Throws naming the key (transformers' name) and the values that work when the shapes do not
  // fit together.
  void validate() const;
  // Throws unless a training sequence of seq_len tokens fits: the RoPE tables cover it, and every
  // compressed layer emits at least one entry (seq_len >= the ratio), CSA's top-k included.
  void validate_sequence(int64_t seq_len) const;
  // Throws, naming training.seq_len, context_parallel_degree and values that work, unless each of
  // the 2 x cp chunks of a sequence holds the window's W - 1 tokens and whole windows of every
  // compress ratio in use (Attention::cp: a chunk borrows only from the chunk before it).
  void validate_context_parallel(int64_t seq_len, int64_t cp) const;
  // The chunk-length multiple and minimum validate_context_parallel asks for.
  struct CpChunks {
    int64_t multiple = 1, minimum = 1;
  };
  CpChunks context_parallel_chunks() const;

  // Analytic parameter count (all experts), and per token (top-K of the routed experts). The MTP
  // modules are counted apart (their own weights; the embedding and head are shared), as V3's.
  struct ParamCount {
    int64_t total = 0, active = 0, embedding = 0;
    int64_t mtp = 0, mtp_active = 0;
  };
  ParamCount parameters() const;
};

// Flavors: "debugmodel" (every layer type and both routings, minutes on two cores), "flash" and
// "pro" (the released shapes; an imported checkpoint's config.json is what a run uses for them).
// vocab_size: the tokenizer's (the flavor's own when <= 0).
DeepSeekV4Args deepseek_v4_flavor(const std::string& flavor, int64_t vocab_size = 0);
std::vector<std::string> deepseek_v4_flavor_names();

// transformers' config.json (model_type "deepseek_v4"), legacy keys included (compress_ratios,
// compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim); `source` names it in errors.
DeepSeekV4Args args_from_hf_config(const nlohmann::json& config, const std::string& source);
nlohmann::json hf_config(const DeepSeekV4Args& a);

}  // namespace titan::models::deepseek_v4
