#include "titan/models/deepseek_v4/args.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "titan/core/error.h"

namespace titan::models::deepseek_v4 {

namespace {

constexpr const char* kCsaName = "compressed_sparse_attention";
constexpr const char* kHcaName = "heavily_compressed_attention";
constexpr const char* kSlidingName = "sliding_attention";

std::string str(int64_t v) { return std::to_string(v); }

// transformers' defaults when a config gives no lists: layers 0-2 HCA, then CSA at odd i, HCA at
// even i; the first three MoE layers hash-routed.
std::vector<LayerType> default_layer_types(int64_t n) {
  std::vector<LayerType> t(size_t(n), LayerType::hca);
  for (int64_t i = 3; i < n; ++i) t[size_t(i)] = i % 2 == 1 ? LayerType::csa : LayerType::hca;
  return t;
}
std::vector<MlpType> default_mlp_types(int64_t n, int64_t hash_layers = 3) {
  std::vector<MlpType> t(size_t(n), MlpType::moe);
  for (int64_t i = 0; i < std::min(n, hash_layers); ++i) t[size_t(i)] = MlpType::hash_moe;
  return t;
}
// The released V4-Flash schedule: layers 0 and 1 sliding-only, then CSA at even i, HCA at odd i.
std::vector<LayerType> flash_layer_types(int64_t n) {
  std::vector<LayerType> t(size_t(n), LayerType::sliding);
  for (int64_t i = 2; i < n; ++i) t[size_t(i)] = i % 2 == 0 ? LayerType::csa : LayerType::hca;
  return t;
}

LayerType layer_type_from_name(const std::string& name, const std::string& source) {
  if (name == kSlidingName) return LayerType::sliding;
  if (name == kCsaName) return LayerType::csa;
  if (name == kHcaName) return LayerType::hca;
  TITAN_FAIL(source + ": layer_types holds \"" + name + "\"",
             std::string("use ") + kSlidingName + ", " + kCsaName + " or " + kHcaName);
}

MlpType mlp_type_from_name(const std::string& name, const std::string& source) {
  if (name == "moe") return MlpType::moe;
  if (name == "hash_moe") return MlpType::hash_moe;
  TITAN_FAIL(source + ": mlp_layer_types holds \"" + name + "\"", "use moe or hash_moe");
}

template <class T>
T value_or(const nlohmann::json& c, const char* key, T fallback) {
  return c.contains(key) && !c[key].is_null() ? c[key].get<T>() : fallback;
}

}  // namespace

const char* layer_type_name(LayerType t) {
  return t == LayerType::sliding ? kSlidingName : t == LayerType::csa ? kCsaName : kHcaName;
}
const char* mlp_type_name(MlpType t) { return t == MlpType::moe ? "moe" : "hash_moe"; }

kernels::RopeConfig DeepSeekV4Args::rope(LayerType t) const {
  kernels::RopeConfig c;
  c.rope_dims = rope_dim;
  c.theta = t == LayerType::sliding ? rope_theta : compress_rope_theta;
  if (t != LayerType::sliding && yarn) {
    c.scaling = kernels::RopeScaling::yarn;
    c.factor = yarn_factor;
    c.original_max_position_embeddings = yarn_original_max_position;
    c.beta_fast = yarn_beta_fast;
    c.beta_slow = yarn_beta_slow;
    c.mscale = c.mscale_all_dim = 1;  // attention_factor 1: unscaled tables and softmax scale
  }
  return c;
}

HyperConnectionArgs DeepSeekV4Args::hyper_connection() const {
  HyperConnectionArgs h;
  h.streams = hc_mult, h.dim = dim, h.sinkhorn_iters = hc_sinkhorn_iters;
  h.hc_eps = hc_eps, h.norm_eps = norm_eps, h.init_std = init_std;
  return h;
}

void DeepSeekV4Args::validate() const {
  const auto positive = [](int64_t v, const char* key) {
    TITAN_CHECK(v >= 1, std::string("deepseek_v4: ") + key + " = " + str(v), "use a positive value");
  };
  for (const auto& [v, key] :
       {std::pair{vocab_size, "vocab_size"}, {dim, "hidden_size"}, {n_layers, "num_hidden_layers"},
        {n_heads, "num_attention_heads"}, {head_dim, "head_dim"}, {q_lora_rank, "q_lora_rank"}, {o_groups, "o_groups"},
        {o_lora_rank, "o_lora_rank"}, {n_routed_experts, "n_routed_experts"}, {n_activated_experts, "num_experts_per_tok"},
        {moe_inter_dim, "moe_intermediate_size"}, {hc_mult, "hc_mult"}, {sliding_window, "sliding_window"},
        {csa_ratio, "compress_rates[compressed_sparse_attention]"},
        {hca_ratio, "compress_rates[heavily_compressed_attention]"}, {max_seq_len, "max_position_embeddings"}})
    positive(v, key);
  TITAN_CHECK(hc_sinkhorn_iters >= 1, "deepseek_v4: hc_sinkhorn_iters = " + str(hc_sinkhorn_iters), "use 1 or more");
  TITAN_CHECK(rope_dim >= 2 && rope_dim % 2 == 0 && rope_dim <= head_dim,
              "deepseek_v4: the RoPE dims (head_dim x partial_rotary_factor) = " + str(rope_dim) + " of head_dim " +
                  str(head_dim),
              "use an even count between 2 and head_dim");
  TITAN_CHECK(n_heads % o_groups == 0,
              "deepseek_v4: o_groups = " + str(o_groups) + " does not divide num_attention_heads = " + str(n_heads),
              "use a divisor of the heads");
  TITAN_CHECK(n_activated_experts <= n_routed_experts,
              "deepseek_v4: num_experts_per_tok = " + str(n_activated_experts) + " exceeds n_routed_experts = " +
                  str(n_routed_experts),
              "use at most " + str(n_routed_experts));
  TITAN_CHECK(int64_t(layer_types.size()) == n_layers,
              "deepseek_v4: layer_types has " + str(int64_t(layer_types.size())) + " entries for num_hidden_layers = " +
                  str(n_layers),
              "give one of sliding_attention, compressed_sparse_attention, heavily_compressed_attention per layer");
  TITAN_CHECK(int64_t(mlp_types.size()) == n_layers,
              "deepseek_v4: mlp_layer_types has " + str(int64_t(mlp_types.size())) + " entries for num_hidden_layers = " +
                  str(n_layers),
              "give one of moe, hash_moe per layer");
  TITAN_CHECK(num_mtp_layers >= 0 && mtp_loss_weight >= 0,
              "deepseek_v4: model.mtp_layers = " + str(num_mtp_layers) + ", model.mtp_loss_weight = " +
                  std::to_string(mtp_loss_weight),
              "use mtp_layers >= 0 (0: no multi-token prediction) and mtp_loss_weight >= 0");
  const bool csa = std::find(layer_types.begin(), layer_types.end(), LayerType::csa) != layer_types.end();
  if (csa) {
    for (const auto& [v, key] :
         {std::pair{index_n_heads, "index_n_heads"}, {index_head_dim, "index_head_dim"}, {index_topk, "index_topk"}})
      positive(v, key);
    TITAN_CHECK(rope_dim <= index_head_dim,
                "deepseek_v4: index_head_dim = " + str(index_head_dim) + " is below the RoPE dims " + str(rope_dim),
                "use index_head_dim >= head_dim x partial_rotary_factor");
  }
}

void DeepSeekV4Args::validate_sequence(int64_t seq_len) const {
  TITAN_CHECK(seq_len > num_mtp_layers,
              "deepseek_v4: training.seq_len = " + str(seq_len) + " leaves no target for MTP module " +
                  str(num_mtp_layers) + " (model.mtp_layers = " + str(num_mtp_layers) + " predicts " +
                  str(num_mtp_layers + 1) + " tokens ahead)",
              "use training.seq_len > model.mtp_layers");
  TITAN_CHECK(seq_len <= max_seq_len,
              "deepseek_v4: training.seq_len = " + str(seq_len) + " exceeds the RoPE tables' " + str(max_seq_len) +
                  " positions",
              "lower training.seq_len to at most " + str(max_seq_len));
  for (int64_t l = 0; l < n_layers; ++l) {
    const LayerType t = layer_types[size_t(l)];
    const int64_t m = compress_ratio(t);
    TITAN_CHECK(m == 0 || seq_len >= m,
                "deepseek_v4: training.seq_len = " + str(seq_len) + " is shorter than layer " + str(l) + "'s " +
                    layer_type_name(t) + " compress ratio " + str(m) + ": it would emit no compressed entry",
                "use training.seq_len >= " + str(m) + ", or a smaller ratio in compress_rates");
  }
}

DeepSeekV4Args::CpChunks DeepSeekV4Args::context_parallel_chunks() const {
  CpChunks c;
  for (LayerType t : layer_types)
    if (const int64_t m = compress_ratio(t); m > 0) c.multiple = std::lcm(c.multiple, m);
  c.minimum = std::max<int64_t>(sliding_window - 1, 1);
  return c;
}

void DeepSeekV4Args::validate_context_parallel(int64_t seq_len, int64_t cp) const {
  if (cp <= 1) return;
  const CpChunks c = context_parallel_chunks();
  const int64_t len = seq_len / (2 * cp);
  if (seq_len % (2 * cp * c.multiple) == 0 && len >= c.minimum) return;
  // The shortest sequences that work: whole chunks of a multiple of the ratios, at least W - 1 long.
  const int64_t step = 2 * cp * c.multiple;
  const int64_t first = std::max((seq_len + step - 1) / step, (c.minimum + c.multiple - 1) / c.multiple) * step;
  const std::string chunks = seq_len % (2 * cp) == 0 ? " makes 2 x " + str(cp) + " chunks of " + str(len) + " tokens"
                                                     : " does not split into 2 x " + str(cp) + " equal chunks";
  TITAN_FAIL("deepseek_v4: training.seq_len = " + str(seq_len) + " with context_parallel_degree = " + str(cp) + chunks +
                 "; each must hold the sliding window's " + str(c.minimum) +
                 " tokens before a query and whole compressed windows (a multiple of " + str(c.multiple) +
                 ", the compress ratios' least common multiple)",
             "use training.seq_len = " + str(first) + " or " + str(first + step) + " (a multiple of 2 x " + str(cp) +
                 " x " + str(c.multiple) + " with chunks >= " + str(c.minimum) +
                 "), or a lower context_parallel_degree");
}

DeepSeekV4Args::ParamCount DeepSeekV4Args::parameters() const {
  const int64_t d = dim, n = hc_mult, hd = head_dim;
  const int64_t hc = (n + 2) * n * n * d + (n + 2) * n + 3;
  const int64_t attention = d * q_lora_rank + q_lora_rank + q_lora_rank * n_heads * hd + d * hd + hd +
                            o_groups * o_lora_rank * (n_heads * hd / o_groups) + d * o_groups * o_lora_rank + n_heads;
  const auto compressor = [&](int64_t width, int64_t m, bool overlap) {
    const int64_t c = overlap ? 2 * width : width;
    return 2 * c * d + m * c + width;
  };
  const int64_t expert = 3 * d * moe_inter_dim;
  ParamCount p;
  p.embedding = vocab_size * d;
  const int64_t common = p.embedding + vocab_size * d /* head */ + d /* norm */ + n * n * d + n + 1 /* hc_head */;
  p.total = p.active = common;
  const auto layer_of = [&](LayerType t) {
    int64_t layer = 2 * hc + 2 * d + attention + n_routed_experts * d /* router */ + expert /* shared */;
    if (t == LayerType::hca) layer += compressor(hd, hca_ratio, false);
    if (t == LayerType::csa)
      layer += compressor(hd, csa_ratio, true) + compressor(index_head_dim, csa_ratio, true) +
               index_n_heads * index_head_dim * q_lora_rank + index_n_heads * d;
    return layer;
  };
  for (LayerType t : layer_types) {
    p.total += layer_of(t) + n_routed_experts * expert;
    p.active += layer_of(t) + n_activated_experts * expert;
  }
  // Each MTP module: a sliding-window layer, e_proj and h_proj, enorm, hnorm, norm and its hc_head.
  const int64_t own = layer_of(LayerType::sliding) + 2 * d * d + 3 * d + n * n * d + n + 1;
  p.mtp = num_mtp_layers * (own + n_routed_experts * expert);
  p.mtp_active = num_mtp_layers * (own + n_activated_experts * expert);
  return p;
}

std::vector<std::string> deepseek_v4_flavor_names() { return {"debugmodel", "flash", "pro", "debugmodel_long"}; }

DeepSeekV4Args deepseek_v4_flavor(const std::string& flavor, int64_t vocab_size) {
  DeepSeekV4Args a;
  if (flavor == "debugmodel" || flavor == "debugmodel_long") {
    // Every layer type and both routings, small enough to train for minutes on two cores.
    // debugmodel_long: the same widths with V4-Flash's attention schedule (window 128, CSA ratio 4
    // with the top-512 entries, HCA ratio 128), for long sequences: the debugmodel's HCA ratio of
    // 16 makes its attention grow with S.
    a.dim = 128, a.n_layers = 6, a.n_heads = 4, a.head_dim = 64, a.rope_dim = 16;
    a.q_lora_rank = 64, a.o_groups = 2, a.o_lora_rank = 32;
    a.n_routed_experts = 8, a.n_activated_experts = 2, a.moe_inter_dim = 64;
    a.sliding_window = 64, a.csa_ratio = 4, a.hca_ratio = 16;
    a.index_n_heads = 4, a.index_head_dim = 32, a.index_topk = 16;
    a.max_seq_len = 4096;
    a.layer_types = {LayerType::sliding, LayerType::csa, LayerType::hca,
                     LayerType::csa,     LayerType::hca, LayerType::csa};
    a.mlp_types = default_mlp_types(a.n_layers, 2);
    if (flavor == "debugmodel_long") {
      a.sliding_window = 128, a.hca_ratio = 128, a.index_topk = 512;
      a.max_seq_len = 65536;
    }
  } else if (flavor == "flash" || flavor == "pro") {
    // transformers' defaults are V4-Flash's shapes with the released layer schedule; V4-Pro's
    // come from its model card (hidden 7168, 61 layers, 128 heads, q_lora 1536, 16 output groups,
    // 384 experts; its expert width and routing scale from secondary sources).
    const bool pro = flavor == "pro";
    a.vocab_size = 129280;
    a.dim = pro ? 7168 : 4096, a.n_layers = pro ? 61 : 43, a.n_heads = pro ? 128 : 64;
    a.head_dim = 512, a.rope_dim = 64, a.q_lora_rank = pro ? 1536 : 1024;
    a.o_groups = pro ? 16 : 8, a.o_lora_rank = 1024;
    a.n_routed_experts = pro ? 384 : 256, a.n_activated_experts = 6, a.moe_inter_dim = pro ? 3072 : 2048;
    a.route_scale = pro ? 2.5 : 1.5;
    a.sliding_window = 128, a.csa_ratio = 4, a.hca_ratio = 128;
    a.index_n_heads = 64, a.index_head_dim = 128, a.index_topk = 512;
    a.max_seq_len = 65536;
    a.layer_types = pro ? default_layer_types(a.n_layers) : flash_layer_types(a.n_layers);
    a.mlp_types = default_mlp_types(a.n_layers);
  } else {
    std::string names;
    for (const std::string& n : deepseek_v4_flavor_names()) names += (names.empty() ? "" : ", ") + n;
    TITAN_FAIL("deepseek_v4 has no flavor \"" + flavor + "\"", "use one of " + names);
  }
  if (vocab_size > 0) a.vocab_size = vocab_size;
  a.validate();
  return a;
}

DeepSeekV4Args args_from_hf_config(const nlohmann::json& c, const std::string& source) {
  try {
    DeepSeekV4Args a;
    a.vocab_size = value_or<int64_t>(c, "vocab_size", 129280);
    a.dim = value_or<int64_t>(c, "hidden_size", 4096);
    a.n_layers = value_or<int64_t>(c, "num_hidden_layers", 43);
    a.n_heads = value_or<int64_t>(c, "num_attention_heads", 64);
    a.head_dim = value_or<int64_t>(c, "head_dim", 512);
    if (c.contains("qk_rope_head_dim")) {
      a.rope_dim = c["qk_rope_head_dim"].get<int64_t>();
    } else {
      const double factor = value_or<double>(c, "partial_rotary_factor", 64.0 / 512.0);
      a.rope_dim = int64_t(std::llround(double(a.head_dim) * factor));
    }
    a.q_lora_rank = value_or<int64_t>(c, "q_lora_rank", 1024);
    a.o_groups = value_or<int64_t>(c, "o_groups", 8);
    a.o_lora_rank = value_or<int64_t>(c, "o_lora_rank", 1024);
    a.norm_eps = value_or<double>(c, "rms_norm_eps", 1e-6);
    a.n_routed_experts = value_or<int64_t>(c, "n_routed_experts", value_or<int64_t>(c, "num_local_experts", 256));
    a.n_activated_experts = value_or<int64_t>(c, "num_experts_per_tok", 6);
    a.moe_inter_dim = value_or<int64_t>(c, "moe_intermediate_size", 2048);
    a.route_scale = value_or<double>(c, "routed_scaling_factor", 1.5);
    const std::string score = value_or<std::string>(c, "scoring_func", "sqrtsoftplus");
    TITAN_CHECK(score == "sqrtsoftplus" || score == "sigmoid", source + ": scoring_func \"" + score + "\"",
                "use sqrtsoftplus or sigmoid");
    a.score_func = score == "sigmoid" ? kernels::RouterScore::sigmoid : kernels::RouterScore::sqrtsoftplus;
    a.swiglu_limit = value_or<double>(c, "swiglu_limit", 10.0);
    a.hc_mult = value_or<int64_t>(c, "hc_mult", 4);
    a.hc_sinkhorn_iters = value_or<int>(c, "hc_sinkhorn_iters", 20);
    a.hc_eps = value_or<double>(c, "hc_eps", 1e-6);
    a.sliding_window = value_or<int64_t>(c, "sliding_window", 128);
    a.csa_ratio = value_or<int64_t>(c, "compress_rate_csa", 4);
    a.hca_ratio = value_or<int64_t>(c, "compress_rate_hca", 128);
    if (c.contains("compress_rates") && c["compress_rates"].is_object()) {
      a.csa_ratio = value_or<int64_t>(c["compress_rates"], kCsaName, a.csa_ratio);
      a.hca_ratio = value_or<int64_t>(c["compress_rates"], kHcaName, a.hca_ratio);
    }
    a.index_n_heads = value_or<int64_t>(c, "index_n_heads", 64);
    a.index_head_dim = value_or<int64_t>(c, "index_head_dim", 128);
    a.index_topk = value_or<int64_t>(c, "index_topk", 512);
    a.max_seq_len = std::min<int64_t>(value_or<int64_t>(c, "max_position_embeddings", 1048576), 65536);
    a.init_std = value_or<double>(c, "initializer_range", 0.02);
    a.rope_theta = value_or<double>(c, "rope_theta", 10000);
    a.compress_rope_theta = value_or<double>(c, "compress_rope_theta", 160000);
    // RoPE: {"main": ..., "compress": ...} as transformers rebuilds it (each with its theta), or
    // a flat dict whose YaRN, if any, goes to the compressed layers only.
    const nlohmann::json* compress = nullptr;
    for (const char* key : {"rope_parameters", "rope_scaling"}) {
      if (!c.contains(key) || !c[key].is_object()) continue;
      const nlohmann::json& r = c[key];
      if (r.contains("main") || r.contains("compress")) {
        if (r.contains("main")) a.rope_theta = value_or<double>(r["main"], "rope_theta", a.rope_theta);
        if (r.contains("compress")) {
          compress = &r["compress"];
          a.compress_rope_theta = value_or<double>(*compress, "rope_theta", a.compress_rope_theta);
        }
      } else {
        compress = &r;
      }
      break;
    }
    if (compress) {
      const std::string type =
          value_or<std::string>(*compress, "rope_type", value_or<std::string>(*compress, "type", "default"));
      if (type == "yarn") {
        a.yarn = true;
        a.yarn_factor = value_or<double>(*compress, "factor", 1);
        a.yarn_original_max_position = value_or<int64_t>(*compress, "original_max_position_embeddings", 65536);
        a.yarn_beta_fast = value_or<double>(*compress, "beta_fast", 32);
        a.yarn_beta_slow = value_or<double>(*compress, "beta_slow", 1);
      }
    }
    // The layer schedule: layer_types, or the legacy per-layer compress_ratios (0, the CSA or the
    // HCA ratio), truncated to the layers as transformers does (the release lists MTP's too).
    if (c.contains("layer_types") && !c["layer_types"].is_null()) {
      for (const auto& t : c["layer_types"]) a.layer_types.push_back(layer_type_from_name(t.get<std::string>(), source));
    } else if (c.contains("compress_ratios") && !c["compress_ratios"].is_null()) {
      for (const auto& r : c["compress_ratios"]) {
        const int64_t m = r.get<int64_t>();
        TITAN_CHECK(m == 0 || m == a.csa_ratio || m == a.hca_ratio,
                    source + ": compress_ratios holds " + str(m) + ", which is neither 0 nor the CSA ratio " +
                        str(a.csa_ratio) + " nor the HCA ratio " + str(a.hca_ratio),
                    "use 0 (sliding only), " + str(a.csa_ratio) + " or " + str(a.hca_ratio));
        a.layer_types.push_back(m == 0 ? LayerType::sliding : m == a.csa_ratio ? LayerType::csa : LayerType::hca);
      }
    } else {
      a.layer_types = default_layer_types(a.n_layers);
    }
    if (int64_t(a.layer_types.size()) > a.n_layers) a.layer_types.resize(size_t(a.n_layers));
    if (c.contains("mlp_layer_types") && !c["mlp_layer_types"].is_null()) {
      for (const auto& t : c["mlp_layer_types"]) a.mlp_types.push_back(mlp_type_from_name(t.get<std::string>(), source));
    } else {
      a.mlp_types = default_mlp_types(a.n_layers, value_or<int64_t>(c, "num_hash_layers", 3));
    }
    if (int64_t(a.mlp_types.size()) > a.n_layers) a.mlp_types.resize(size_t(a.n_layers));
    a.validate();
    return a;
  } catch (const nlohmann::json::exception& e) {
    TITAN_FAIL(source + ": a DeepSeek-V4 key has the wrong type (" + e.what() + ")",
               "compare it with transformers' DeepseekV4Config");
  }
}

nlohmann::json hf_config(const DeepSeekV4Args& a) {
  nlohmann::json c;
  c["architectures"] = {"DeepseekV4ForCausalLM"};
  c["model_type"] = "deepseek_v4";
  c["vocab_size"] = a.vocab_size, c["hidden_size"] = a.dim, c["num_hidden_layers"] = a.n_layers;
  c["num_attention_heads"] = a.n_heads, c["head_dim"] = a.head_dim;
  c["partial_rotary_factor"] = double(a.rope_dim) / double(a.head_dim);
  c["q_lora_rank"] = a.q_lora_rank, c["o_groups"] = a.o_groups, c["o_lora_rank"] = a.o_lora_rank;
  c["rms_norm_eps"] = a.norm_eps;
  c["n_routed_experts"] = a.n_routed_experts, c["num_experts_per_tok"] = a.n_activated_experts;
  c["moe_intermediate_size"] = a.moe_inter_dim, c["routed_scaling_factor"] = a.route_scale;
  c["scoring_func"] = a.score_func == kernels::RouterScore::sigmoid ? "sigmoid" : "sqrtsoftplus";
  c["swiglu_limit"] = a.swiglu_limit;
  c["hc_mult"] = a.hc_mult, c["hc_sinkhorn_iters"] = a.hc_sinkhorn_iters, c["hc_eps"] = a.hc_eps;
  c["sliding_window"] = a.sliding_window;
  c["compress_rates"] = {{kCsaName, a.csa_ratio}, {kHcaName, a.hca_ratio}};
  c["index_n_heads"] = a.index_n_heads, c["index_head_dim"] = a.index_head_dim, c["index_topk"] = a.index_topk;
  c["max_position_embeddings"] = a.max_seq_len, c["initializer_range"] = a.init_std;
  c["rope_theta"] = a.rope_theta, c["compress_rope_theta"] = a.compress_rope_theta;
  // As transformers saves it: each RoPE with its theta, YaRN (attention_factor 1) on "compress".
  const double factor = double(a.rope_dim) / double(a.head_dim);
  nlohmann::json compress = {{"rope_type", "default"}, {"rope_theta", a.compress_rope_theta},
                             {"partial_rotary_factor", factor}};
  if (a.yarn) {
    compress["rope_type"] = "yarn", compress["factor"] = a.yarn_factor, compress["attention_factor"] = 1.0;
    compress["original_max_position_embeddings"] = a.yarn_original_max_position;
    compress["beta_fast"] = a.yarn_beta_fast, compress["beta_slow"] = a.yarn_beta_slow;
  }
  c["rope_parameters"] = {
      {"main", {{"rope_type", "default"}, {"rope_theta", a.rope_theta}, {"partial_rotary_factor", factor}}},
      {"compress", compress}};
  for (LayerType t : a.layer_types) c["layer_types"].push_back(layer_type_name(t));
  for (MlpType t : a.mlp_types) c["mlp_layer_types"].push_back(mlp_type_name(t));
  c["tie_word_embeddings"] = false;
  return c;
}

}  // namespace titan::models::deepseek_v4
