#include "titan/models/deepseek_v3/args.h"

#include <algorithm>
#include <cmath>

#include "titan/core/error.h"

namespace titan::models::deepseek_v3 {

double DeepSeekV3Args::out_proj_std(int layer_id) const {
  return depth_init ? kInitStd / std::sqrt(2.0 * (layer_id + 1)) : kInitStd / std::sqrt(2.0 * double(n_layers));
}

kernels::RopeConfig DeepSeekV3Args::rope() const {
  kernels::RopeConfig c;
  c.rope_dims = qk_rope_head_dim;
  c.theta = rope_theta;
  if (yarn()) {
    c.scaling = kernels::RopeScaling::yarn;
    c.factor = rope_factor;
    c.original_max_position_embeddings = original_seq_len;
    c.beta_fast = beta_fast;
    c.beta_slow = beta_slow;
    // Equal mscales leave the cos/sin tables unscaled: DeepSeek puts YaRN's temperature only
    // into the softmax scale (softmax_scale()).
    c.mscale = c.mscale_all_dim = mscale;
  }
  return c;
}

double DeepSeekV3Args::softmax_scale() const {
  const double m = yarn() ? kernels::yarn_mscale(rope_factor, mscale) : 1.0;
  return m * m / std::sqrt(double(qk_head_dim()));
}

DeepSeekV3Args::ParamCount DeepSeekV3Args::parameters() const {
  const int64_t h = n_heads, dqk = qk_head_dim();
  const int64_t q = q_lora_rank == 0 ? dim * h * dqk : dim * q_lora_rank + q_lora_rank + q_lora_rank * h * dqk;
  const int64_t kv = dim * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank +
                     kv_lora_rank * h * (qk_nope_head_dim + v_head_dim);
  // Lightning indexer: wq_b, wk, k_norm (weight and bias), weights_proj.
  const int64_t indexer = has_indexer() ? index_n_heads * index_head_dim * q_lora_rank + index_head_dim * dim +
                                              2 * index_head_dim + index_n_heads * dim
                                        : 0;
  const int64_t attention = q + kv + h * v_head_dim * dim + indexer;
  const int64_t norms = 2 * dim;
  const int64_t dense_ffn = 3 * dim * inter_dim;
  const int64_t router = n_routed_experts * dim;
  const int64_t routed = 3 * n_routed_experts * dim * moe_inter_dim;
  const int64_t shared = 3 * dim * moe_inter_dim * n_shared_experts;
  // TorchTitan's rounding: the routed experts' total times top_k / n_routed_experts.
  const int64_t moe_total = router + routed + shared;
  const int64_t moe_active = router + shared + routed * n_activated_experts / n_routed_experts;
  const int64_t dense_layers = std::min(n_dense_layers, n_layers), moe_layers = n_layers - dense_layers;
  ParamCount c;
  c.embedding = vocab_size * dim;
  c.indexer = indexer;
  const int64_t common = n_layers * (attention + norms) + dense_layers * dense_ffn + dim /* final norm */ +
                         vocab_size * dim /* output */ + c.embedding;
  c.total = common + moe_layers * moe_total;
  c.active = common + moe_layers * moe_active;
  for (int64_t k = 0; k < num_mtp_layers; ++k) {
    // enorm, hnorm, eh_proj [D, 2D], the block, the head's norm.
    const int64_t own = 3 * dim + 2 * dim * dim + attention + norms;
    const bool moe = is_moe_layer(n_layers + k);
    c.mtp += own + (moe ? moe_total : dense_ffn);
    c.mtp_active += own + (moe ? moe_active : dense_ffn);
  }
  return c;
}

double DeepSeekV3Args::training_flops_per_token(int64_t seq_len) const {
  return training_flops_per_token(seq_len, seq_len, false);
}

double DeepSeekV3Args::training_flops_per_token(int64_t seq_len, int64_t keys, bool main_frozen) const {
  const ParamCount c = parameters();
  const double mtp = double(c.mtp_active + num_mtp_layers * vocab_size * dim);  // + the shared head per module
  const int64_t blocks = n_layers + num_mtp_layers;
  const double indexer_weights = double(blocks * c.indexer);
  const double main_weights = double(c.active - c.embedding) + mtp - indexer_weights;
  const double pass = main_frozen ? 2.0 : 6.0;  // forward only, or forward + backward
  return pass * main_weights + 6.0 * indexer_weights +
         pass * double(blocks * n_heads * (qk_nope_head_dim + qk_rope_head_dim + v_head_dim) * keys) +
         (has_indexer() ? 6.0 * double(blocks * index_n_heads * index_head_dim * seq_len) : 0.0);
}

void DeepSeekV3Args::validate() const {
  auto fail = [](const std::string& what, const std::string& hint) { TITAN_FAIL("deepseek_v3: " + what, hint); };
  if (dim <= 0 || n_layers <= 0 || n_heads <= 0 || vocab_size <= 0 || inter_dim <= 0)
    fail("dim, n_layers, n_heads, vocab_size and inter_dim must be positive", "check the flavor or config.json");
  if (num_mtp_layers < 0 || mtp_loss_weight < 0)
    fail("num_mtp_layers and mtp_loss_weight must be >= 0, got " + std::to_string(num_mtp_layers) + " and " +
             std::to_string(mtp_loss_weight),
         "use 0 layers for no multi-token prediction; DeepSeek-V3 uses 1 layer and weight 0.3");
  if (n_dense_layers < 0 || n_dense_layers > n_layers + num_mtp_layers)
    fail("n_dense_layers " + std::to_string(n_dense_layers) + " is outside [0, n_layers + num_mtp_layers = " +
             std::to_string(n_layers + num_mtp_layers) + "]",
         "n_dense_layers (first_k_dense_replace) counts the leading layers with a dense FFN");
  if (q_lora_rank < 0 || kv_lora_rank <= 0 || qk_nope_head_dim <= 0 || v_head_dim <= 0)
    fail("q_lora_rank must be >= 0 and kv_lora_rank, qk_nope_head_dim, v_head_dim > 0",
         "DeepSeek-V3 uses q_lora_rank 1536 (0 for a plain wq), kv_lora_rank 512, 128 / 64 / 128 head dims");
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2 != 0)
    fail("qk_rope_head_dim must be positive and even, got " + std::to_string(qk_rope_head_dim),
         "RoPE rotates pairs of dims");
  if (n_layers + num_mtp_layers > n_dense_layers) {
    if (moe_inter_dim <= 0 || n_routed_experts <= 0 || n_shared_experts < 0 || n_activated_experts <= 0 ||
        n_activated_experts > n_routed_experts)
      fail("MoE layers need moe_inter_dim > 0 and 0 < n_activated_experts <= n_routed_experts (got " +
               std::to_string(n_activated_experts) + " of " + std::to_string(n_routed_experts) + ")",
           "or make every layer dense with n_dense_layers = n_layers");
    if (n_expert_groups <= 0 || n_routed_experts % n_expert_groups != 0 || n_limited_groups <= 0 ||
        n_limited_groups > n_expert_groups)
      fail("n_expert_groups " + std::to_string(n_expert_groups) + " must divide n_routed_experts " +
               std::to_string(n_routed_experts) + " and n_limited_groups must be in [1, n_expert_groups]",
           "use 1 and 1 for routing without groups");
  }
  if (has_indexer()) {
    if (q_lora_rank <= 0)
      fail("the lightning indexer (index_n_heads " + std::to_string(index_n_heads) +
               ") needs q_lora_rank > 0: its query projection wq_b reads the normed query latent",
           "set q_lora_rank (DeepSeek-V3.2 uses 1536) or index_n_heads = 0 for plain DeepSeek-V3");
    if (index_head_dim < qk_rope_head_dim || index_topk <= 0)
      fail("index_head_dim " + std::to_string(index_head_dim) + " must be >= qk_rope_head_dim " +
               std::to_string(qk_rope_head_dim) + " (its first dims get RoPE) and index_topk > 0",
           "DeepSeek-V3.2 uses index_head_dim 128, qk_rope_head_dim 64, index_topk 2048");
    if (index_hadamard && (index_head_dim & (index_head_dim - 1)) != 0)
      fail("index_hadamard needs a power-of-two index_head_dim, got " + std::to_string(index_head_dim),
           "use 64 or 128, or set index_hadamard = false");
  }
  if (max_seq_len <= 0 || original_seq_len <= 0 || rope_factor < 1)
    fail("max_seq_len and original_seq_len must be positive and rope_factor >= 1", "DeepSeek-V3 uses 4096 and 40");
}

namespace {
struct Flavor {
  const char* name;
  DeepSeekV3Args args;
};

std::vector<Flavor> flavors() {
  DeepSeekV3Args debug;  // the struct's defaults are TorchTitan's debugmodel
  debug.mscale = 0.70;
  // ~100M total / ~36M active parameters with the 2048-token test tokenizer: DeepSeek-V2-Lite's
  // shape (fine-grained experts, 6 of them active, 2 shared, one dense layer, plain wq) scaled
  // down, so a whole-model training step takes seconds on a CPU (bench_train_step).
  DeepSeekV3Args m100 = debug;
  m100.dim = 512, m100.n_layers = 8, m100.n_heads = 8, m100.inter_dim = 2048, m100.moe_inter_dim = 256;
  m100.n_routed_experts = 32, m100.n_shared_experts = 2, m100.n_activated_experts = 6;
  m100.kv_lora_rank = 256, m100.qk_nope_head_dim = 64, m100.qk_rope_head_dim = 32, m100.v_head_dim = 64;
  DeepSeekV3Args b16 = debug;
  b16.vocab_size = 102400, b16.dim = 2048, b16.inter_dim = 10944, b16.moe_inter_dim = 1408, b16.n_layers = 27;
  b16.n_routed_experts = 64, b16.n_shared_experts = 2, b16.n_activated_experts = 6;
  DeepSeekV3Args b236 = b16;
  b236.dim = 5120, b236.inter_dim = 12288, b236.moe_inter_dim = 1536, b236.n_layers = 60, b236.n_heads = 128;
  b236.n_routed_experts = 160, b236.n_activated_experts = 6, b236.n_expert_groups = 8, b236.n_limited_groups = 3;
  b236.route_scale = 16, b236.q_lora_rank = 1536, b236.mscale = 1.0;
  DeepSeekV3Args b671 = b236;
  b671.vocab_size = 129280, b671.dim = 7168, b671.inter_dim = 18432, b671.moe_inter_dim = 2048;
  b671.n_layers = 61, b671.n_dense_layers = 3, b671.n_routed_experts = 256, b671.n_shared_experts = 1;
  b671.n_activated_experts = 8, b671.n_limited_groups = 4, b671.score_func = ScoreFunc::sigmoid;
  b671.route_norm = true, b671.route_scale = 2.5;
  return {{"debugmodel", debug}, {"100M", m100}, {"16B", b16}, {"236B", b236}, {"671B", b671}};
}

// The named flavor of a family with the tokenizer's vocabulary, validated; throws listing the
// family's flavors for an unknown name.
DeepSeekV3Args pick_flavor(const std::vector<Flavor>& list, const char* family, const std::string& flavor,
                           int64_t vocab_size) {
  for (const Flavor& f : list) {
    if (f.name != flavor) continue;
    DeepSeekV3Args a = f.args;
    if (vocab_size > 0) a.vocab_size = vocab_size;
    a.validate();
    return a;
  }
  std::string names;
  for (const Flavor& f : list) names += (names.empty() ? "" : ", ") + std::string(f.name);
  TITAN_FAIL("unknown " + std::string(family) + " flavor '" + flavor + "'", "set [model] flavor to one of: " + names);
}

std::vector<std::string> flavor_names(const std::vector<Flavor>& list) {
  std::vector<std::string> out;
  for (const Flavor& f : list) out.push_back(f.name);
  return out;
}
}  // namespace

DeepSeekV3Args deepseek_v3_flavor(const std::string& flavor, int64_t vocab_size) {
  return pick_flavor(flavors(), "deepseek_v3", flavor, vocab_size);
}

std::vector<std::string> deepseek_v3_flavor_names() { return flavor_names(flavors()); }

namespace {
std::vector<Flavor> v32_flavors() {
  DeepSeekV3Args debug = deepseek_v3_flavor("debugmodel");
  // The indexer reads the query latent, so the debug model gets one (V3's debugmodel has none).
  debug.q_lora_rank = 128;
  debug.index_n_heads = 4, debug.index_head_dim = 64, debug.index_topk = 256;
  DeepSeekV3Args b671 = deepseek_v3_flavor("671B");
  b671.index_n_heads = 64, b671.index_head_dim = 128, b671.index_topk = 2048;
  return {{"debugmodel", debug}, {"671B", b671}};
}
}  // namespace

DeepSeekV3Args deepseek_v32_flavor(const std::string& flavor, int64_t vocab_size) {
  return pick_flavor(v32_flavors(), "deepseek_v32", flavor, vocab_size);
}

std::vector<std::string> deepseek_v32_flavor_names() { return flavor_names(v32_flavors()); }

}  // namespace titan::models::deepseek_v3
