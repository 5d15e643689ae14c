#include "titan/models/deepseek_v3/hf_adapter.h"

#include <set>

#include "titan/core/error.h"

namespace titan::models::deepseek_v3 {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Reads config.json keys with HF's defaults (DeepseekV3Config) for the optional ones.
class ConfigReader {
 public:
  ConfigReader(const json& c, std::string source) : c_(c), source_(std::move(source)) {
    TITAN_CHECK(c_.is_object(), source_ + ": config.json is not a JSON object", "the file is corrupt");
  }
  bool has(const std::string& key) const { return c_.contains(key) && !c_[key].is_null(); }
  int64_t integer(const std::string& key) const {
    require(key);
    TITAN_CHECK(c_[key].is_number_integer(), where(key) + " must be an integer, got " + c_[key].dump(),
                "fix config.json");
    return c_[key].get<int64_t>();
  }
  int64_t integer(const std::string& key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  double number(const json& obj, const std::string& key, double fallback, const std::string& path) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    TITAN_CHECK(obj[key].is_number(), where(path + key) + " must be a number, got " + obj[key].dump(), "fix config.json");
    return obj[key].get<double>();
  }
  double number(const std::string& key, double fallback) const { return number(c_, key, fallback, ""); }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    TITAN_CHECK(c_[key].is_boolean(), where(key) + " must be true or false, got " + c_[key].dump(), "fix config.json");
    return c_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    TITAN_CHECK(c_[key].is_string(), where(key) + " must be a string, got " + c_[key].dump(), "fix config.json");
    return c_[key].get<std::string>();
  }
  const json& at(const std::string& key) const { return c_[key]; }
  std::string where(const std::string& key) const { return source_ + ": config key '" + key + "'"; }
  [[noreturn]] void unsupported(const std::string& key, const std::string& why, const std::string& hint) const {
    TITAN_FAIL(where(key) + " " + why, hint);
  }

 private:
  void require(const std::string& key) const {
    TITAN_CHECK(has(key), where(key) + " is missing", "a DeepSeek-V3 config.json sets it; compare with the published one");
  }
  const json& c_;
  std::string source_;
};

// Our per-layer suffix -> HF's (after "layers.L." / "model.layers.L.").
const std::vector<std::pair<std::string, std::string>>& layer_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"attention.q_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attention.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attention.wkv_b.weight", "self_attn.kv_b_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},
      {"attention.indexer.wq_b.weight", "self_attn.indexer.wq_b.weight"},
      {"attention.indexer.wk.weight", "self_attn.indexer.wk.weight"},
      {"attention.indexer.k_norm.weight", "self_attn.indexer.k_norm.weight"},
      {"attention.indexer.k_norm.bias", "self_attn.indexer.k_norm.bias"},
      {"attention.indexer.weights_proj.weight", "self_attn.indexer.weights_proj.weight"},
      {"attention_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
      {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"},
      {"moe.router.gate.weight", "mlp.gate.weight"},
      {"moe.expert_bias", "mlp.gate.e_score_correction_bias"},
      {"moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
  };
  return names;
}

// An MTP module's own weights (after "mtp.K." / "model.layers.<n_layers + K>."); its block's
// weights follow layer_names() after "mtp.K.block.".
const std::vector<std::pair<std::string, std::string>>& mtp_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"enorm.weight", "enorm.weight"},
      {"hnorm.weight", "hnorm.weight"},
      {"eh_proj.weight", "eh_proj.weight"},
      {"norm.weight", "shared_head.norm.weight"},
  };
  return names;
}

// DeepSeek's checkpoint repeats the shared embedding and head inside each MTP layer; ours shares them.
const char* kMtpSharedCopies[] = {"embed_tokens.weight", "shared_head.head.weight"};

// Stacked expert weights: ours "moe.experts.wN" [E, ...] <- HF "mlp.experts.E.<proj>.weight".
const std::vector<std::pair<std::string, std::string>>& expert_names() {
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"moe.experts.w1", "gate_proj"}, {"moe.experts.w3", "up_proj"}, {"moe.experts.w2", "down_proj"}};
  return names;
}

// The layer index of an HF name "model.layers.L.*", or -1.
int64_t hf_layer(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return -1;
  try {
    return std::stoll(name.substr(prefix.size(), dot - prefix.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

// transformers' DeepSeek-V3.2 lists each layer's FFN ("dense" or "sparse" = MoE) and attention
// kind; ours is "first n_dense_layers dense, then MoE" and DSA in every layer.
void check_layer_types(const ConfigReader& r, DeepSeekV3Args& a) {
  if (r.has("mlp_layer_types")) {
    const json& types = r.at("mlp_layer_types");
    if (!types.is_array() || int64_t(types.size()) != a.n_layers)
      r.unsupported("mlp_layer_types", "is not a list of num_hidden_layers entries", "fix config.json");
    int64_t dense = 0;
    while (dense < a.n_layers && types[size_t(dense)] == "dense") ++dense;
    for (int64_t l = dense; l < a.n_layers; ++l)
      if (types[size_t(l)] != "sparse")
        r.unsupported("mlp_layer_types", "entry " + std::to_string(l) + " is " + types[size_t(l)].dump() +
                                             " after the dense prefix",
                      "DeepSeek models put the dense FFN layers first and MoE ('sparse') after them");
    a.n_dense_layers = dense;  // transformers builds the layers from this list, not first_k_dense_replace
  }
  if (r.has("layer_types")) {
    const json& types = r.at("layer_types");
    if (!types.is_array()) r.unsupported("layer_types", "is not a list", "fix config.json");
    for (const json& t : types)
      if (t != "indexed_attention")
        r.unsupported("layer_types", "has the entry " + t.dump(), "every DeepSeek-V3.2 layer is 'indexed_attention'");
  }
}

}  // namespace

DeepSeekV3Args args_from_hf_config(const json& config, const std::string& source) {
  const ConfigReader r(config, source);
  const std::string model_type = r.string("model_type", "deepseek_v3");
  if (model_type != "deepseek_v3" && model_type != "deepseek_v32")
    r.unsupported("model_type", "is '" + model_type + "', not 'deepseek_v3' or 'deepseek_v32'",
                  "this adapter reads DeepSeek-V3 and V3.2 checkpoints");
  DeepSeekV3Args a;
  a.vocab_size = r.integer("vocab_size");
  a.dim = r.integer("hidden_size");
  a.inter_dim = r.integer("intermediate_size");
  a.n_layers = r.integer("num_hidden_layers");
  a.n_heads = r.integer("num_attention_heads");
  a.kv_lora_rank = r.integer("kv_lora_rank");
  a.qk_nope_head_dim = r.integer("qk_nope_head_dim");
  a.qk_rope_head_dim = r.integer("qk_rope_head_dim");
  a.v_head_dim = r.integer("v_head_dim");
  a.q_lora_rank = r.integer("q_lora_rank", 0);  // null: a plain q_proj
  a.num_mtp_layers = r.integer("num_nextn_predict_layers", 0);
  if (a.num_mtp_layers < 0) r.unsupported("num_nextn_predict_layers", "is negative", "use 0 (no MTP) or more");
  a.n_dense_layers = std::min(r.integer("first_k_dense_replace", 3), a.n_layers + a.num_mtp_layers);
  if (r.integer("moe_layer_freq", 1) != 1)
    r.unsupported("moe_layer_freq", "is not 1", "DeepSeek-V3 makes every layer after the dense ones MoE");
  a.moe_inter_dim = r.integer("moe_intermediate_size", 2048);
  a.n_routed_experts = r.integer("n_routed_experts", 256);
  a.n_shared_experts = r.integer("n_shared_experts", 1);
  a.n_activated_experts = r.integer("num_experts_per_tok", 8);
  a.n_expert_groups = r.integer("n_group", 8);
  a.n_limited_groups = r.integer("topk_group", 4);
  a.route_scale = r.number("routed_scaling_factor", 2.5);
  a.route_norm = r.boolean("norm_topk_prob", true);
  const std::string score = r.string("scoring_func", "sigmoid");
  if (score != "sigmoid" && score != "softmax")
    r.unsupported("scoring_func", "is '" + score + "'", "DeepSeek routers use 'sigmoid' (V3) or 'softmax' (V2)");
  a.score_func = score == "sigmoid" ? ScoreFunc::sigmoid : ScoreFunc::softmax;
  a.norm_eps = r.number("rms_norm_eps", 1e-6);
  if (r.integer("num_key_value_heads", a.n_heads) != a.n_heads)
    r.unsupported("num_key_value_heads", "differs from num_attention_heads", "MLA has one KV latent; set it equal");
  if (r.boolean("tie_word_embeddings", false))
    r.unsupported("tie_word_embeddings", "is true", "DeepSeek-V3 keeps a separate lm_head; untie it before converting");
  if (r.boolean("attention_bias", false))
    r.unsupported("attention_bias", "is true", "our MLA projections have no biases");
  if (r.string("hidden_act", "silu") != "silu") r.unsupported("hidden_act", "is not 'silu'", "the FFNs are SwiGLU");
  if (!r.boolean("rope_interleave", true))
    r.unsupported("rope_interleave", "is false (rotate-half RoPE weights)",
                  "DeepSeek's checkpoints use interleaved RoPE; export with rope_interleave = true");
  if (model_type == "deepseek_v32") {
    // DeepSeek Sparse Attention: the lightning indexer (defaults: transformers' DeepseekV32Config).
    check_layer_types(r, a);
    a.index_n_heads = r.integer("index_n_heads", 64);
    a.index_head_dim = r.integer("index_head_dim", 128);
    a.index_topk = r.integer("index_topk", 2048);
    a.index_hadamard = r.boolean("index_hadamard", true);  // ours; score-preserving, so HF has no such key
    // (validate() below checks the indexer's shapes against the rest.)
    if (a.index_n_heads <= 0) r.unsupported("index_n_heads", "is not positive", "DeepSeek-V3.2 uses 64");
  }

  // RoPE: "rope_scaling" (DeepSeek's published configs) or "rope_parameters" (transformers >= 5,
  // which also moves rope_theta inside).
  const std::string rope_key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json rope = r.has(rope_key) ? r.at(rope_key) : json::object();
  if (!rope.is_object()) r.unsupported(rope_key, "is not an object", "fix config.json");
  a.rope_theta = r.number(rope, "rope_theta", r.number("rope_theta", 10000), rope_key + ".");
  const int64_t max_pos = r.integer("max_position_embeddings", 4096);
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (type == "yarn") {
    a.rope_factor = r.number(rope, "factor", 1, rope_key + ".");
    a.beta_fast = r.number(rope, "beta_fast", 32, rope_key + ".");
    a.beta_slow = r.number(rope, "beta_slow", 1, rope_key + ".");
    a.original_seq_len = int64_t(r.number(rope, "original_max_position_embeddings", 4096, rope_key + "."));
    const double mscale = r.number(rope, "mscale", 1, rope_key + ".");
    const double mscale_all_dim = r.number(rope, "mscale_all_dim", 0, rope_key + ".");
    // HF scales the cos/sin tables by yarn(mscale) / yarn(mscale_all_dim) and the softmax by
    // yarn(mscale_all_dim)^2; DeepSeek's reference (and our MLA) only has the softmax factor,
    // which is the same function exactly when the two are equal.
    if (mscale != mscale_all_dim)
      r.unsupported(rope_key + ".mscale", "(" + std::to_string(mscale) + ") differs from mscale_all_dim (" +
                                              std::to_string(mscale_all_dim) + ")",
                    "DeepSeek-V3 sets both to the same value (1.0; 0.707 for V2-Lite)");
    a.mscale = mscale;
    a.max_seq_len = max_pos;
    if (a.max_seq_len <= a.original_seq_len)
      r.unsupported("max_position_embeddings", "(" + std::to_string(max_pos) +
                                                   ") does not exceed original_max_position_embeddings under YaRN",
                    "DeepSeek-V3 uses 163840 and 4096; HF applies YaRN regardless, DeepSeek's reference only above it");
  } else if (type == "default") {
    a.max_seq_len = a.original_seq_len = max_pos;  // no context extension: YaRN off
  } else {
    r.unsupported(rope_key + ".type", "is '" + type + "'", "DeepSeek-V3 uses 'yarn' (or no rope scaling)");
  }
  try {
    a.validate();
  } catch (const Error& e) {
    TITAN_FAIL(source + ": " + e.message(), e.hint());
  }
  return a;
}

json hf_config_from_args(const DeepSeekV3Args& a) {
  json c = {
      {"architectures", {a.has_indexer() ? "DeepseekV32ForCausalLM" : "DeepseekV3ForCausalLM"}},
      {"model_type", a.has_indexer() ? "deepseek_v32" : "deepseek_v3"},
      {"vocab_size", a.vocab_size},
      {"hidden_size", a.dim},
      {"intermediate_size", a.inter_dim},
      {"moe_intermediate_size", a.moe_inter_dim},
      {"num_hidden_layers", a.n_layers},
      {"first_k_dense_replace", a.n_dense_layers},
      {"moe_layer_freq", 1},
      {"num_nextn_predict_layers", a.num_mtp_layers},
      {"num_attention_heads", a.n_heads},
      {"num_key_value_heads", a.n_heads},
      {"n_routed_experts", a.n_routed_experts},
      {"n_shared_experts", a.n_shared_experts},
      {"num_experts_per_tok", a.n_activated_experts},
      {"n_group", a.n_expert_groups},
      {"topk_group", a.n_limited_groups},
      {"routed_scaling_factor", a.route_scale},
      {"norm_topk_prob", a.route_norm},
      {"scoring_func", a.score_func == ScoreFunc::sigmoid ? "sigmoid" : "softmax"},
      {"topk_method", "noaux_tc"},
      {"q_lora_rank", a.q_lora_rank > 0 ? json(a.q_lora_rank) : json(nullptr)},
      {"kv_lora_rank", a.kv_lora_rank},
      {"qk_nope_head_dim", a.qk_nope_head_dim},
      {"qk_rope_head_dim", a.qk_rope_head_dim},
      {"v_head_dim", a.v_head_dim},
      {"hidden_act", "silu"},
      {"rms_norm_eps", a.norm_eps},
      {"rope_theta", a.rope_theta},
      {"max_position_embeddings", a.max_seq_len},
      {"rope_interleave", true},
      {"attention_bias", false},
      {"tie_word_embeddings", false},
      {"torch_dtype", "bfloat16"},
  };
  if (a.has_indexer()) {
    c["index_n_heads"] = a.index_n_heads;
    c["index_head_dim"] = a.index_head_dim;
    c["index_topk"] = a.index_topk;
    c["index_hadamard"] = a.index_hadamard;
  }
  if (a.yarn()) {
    c["rope_scaling"] = {{"type", "yarn"},
                         {"factor", a.rope_factor},
                         {"beta_fast", a.beta_fast},
                         {"beta_slow", a.beta_slow},
                         {"mscale", a.mscale},
                         {"mscale_all_dim", a.mscale},
                         {"original_max_position_embeddings", a.original_seq_len}};
  } else {
    c["rope_scaling"] = nullptr;
  }
  return c;
}

DeepSeekV3Args args_from_hf_folder(const checkpoint::HfFolder& folder, std::string* note) {
  const std::string source = (folder.dir() / "config.json").string();
  DeepSeekV3Args a = args_from_hf_config(folder.config(), source);
  const int64_t declared = a.num_mtp_layers;
  std::set<int64_t> present;  // the MTP layers (by K) any tensor is named after
  for (const std::string& n : folder.names())
    if (const int64_t l = hf_layer(n); l >= a.n_layers && l < a.n_layers + declared) present.insert(l - a.n_layers);
  int64_t held = 0;
  while (present.count(held)) ++held;
  const auto layer = [&](int64_t k) { return "model.layers." + std::to_string(a.n_layers + k) + ".*"; };
  if (held < int64_t(present.size()))
    TITAN_FAIL(folder.dir().string() + " holds weights for MTP layer " + layer(*present.rbegin()) + " but none for " +
                   layer(held) + " before it",
               "MTP module K is layer num_hidden_layers + K; the folder is missing a shard or mixes two exports");
  if (held == declared) return a;
  a.num_mtp_layers = held;
  a.n_dense_layers = std::min(a.n_dense_layers, a.n_layers + held);
  if (note) {
    const std::string d = std::to_string(declared);
    *note = held == 0 ? folder.dir().string() + ": config.json has num_nextn_predict_layers " + d +
                            " but the folder holds no MTP weights (" + layer(0) +
                            "; transformers saves none): imported without MTP; training with --model.mtp_layers=" + d +
                            " starts MTP fresh, without it MTP is off"
                      : folder.dir().string() + ": config.json has num_nextn_predict_layers " + d +
                            " but the folder holds weights for the first " + std::to_string(held) +
                            " MTP layers only (none for " + layer(held) + "): imported those; training with "
                            "--model.mtp_layers=" + d + " starts the others fresh";
  }
  return a;
}

std::vector<std::pair<std::string, Shape>> state_shapes(const DeepSeekV3Args& a) {
  const int64_t d = a.dim, h = a.n_heads, dqk = a.qk_head_dim(), e = a.n_routed_experts, mi = a.moe_inter_dim;
  std::vector<std::pair<std::string, Shape>> out = {{"tok_embeddings.weight", {a.vocab_size, d}}};
  // One TransformerBlock's state under prefix p (layer id l).
  auto block = [&](const std::string& p, int64_t l) {
    if (a.q_lora_rank == 0) {
      out.push_back({p + "attention.wq.weight", {h * dqk, d}});
    } else {
      out.push_back({p + "attention.wq_a.weight", {a.q_lora_rank, d}});
      out.push_back({p + "attention.q_norm.weight", {a.q_lora_rank}});
      out.push_back({p + "attention.wq_b.weight", {h * dqk, a.q_lora_rank}});
    }
    out.push_back({p + "attention.wkv_a.weight", {a.kv_lora_rank + a.qk_rope_head_dim, d}});
    out.push_back({p + "attention.kv_norm.weight", {a.kv_lora_rank}});
    out.push_back({p + "attention.wkv_b.weight", {h * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank}});
    out.push_back({p + "attention.wo.weight", {d, h * a.v_head_dim}});
    if (a.has_indexer()) {
      const int64_t di = a.index_head_dim;
      out.push_back({p + "attention.indexer.wq_b.weight", {a.index_n_heads * di, a.q_lora_rank}});
      out.push_back({p + "attention.indexer.wk.weight", {di, d}});
      out.push_back({p + "attention.indexer.k_norm.weight", {di}});
      out.push_back({p + "attention.indexer.k_norm.bias", {di}});
      out.push_back({p + "attention.indexer.weights_proj.weight", {a.index_n_heads, d}});
    }
    if (a.is_moe_layer(l)) {
      const int64_t si = mi * a.n_shared_experts;
      out.push_back({p + "moe.router.gate.weight", {e, d}});
      out.push_back({p + "moe.experts.w1", {e, mi, d}});
      out.push_back({p + "moe.experts.w2", {e, d, mi}});
      out.push_back({p + "moe.experts.w3", {e, mi, d}});
      if (si > 0) {
        out.push_back({p + "moe.shared_experts.w1.weight", {si, d}});
        out.push_back({p + "moe.shared_experts.w2.weight", {d, si}});
        out.push_back({p + "moe.shared_experts.w3.weight", {si, d}});
      }
      out.push_back({p + "moe.expert_bias", {e}});
    } else {
      out.push_back({p + "feed_forward.w1.weight", {a.inter_dim, d}});
      out.push_back({p + "feed_forward.w2.weight", {d, a.inter_dim}});
      out.push_back({p + "feed_forward.w3.weight", {a.inter_dim, d}});
    }
    out.push_back({p + "attention_norm.weight", {d}});
    out.push_back({p + "ffn_norm.weight", {d}});
  };
  for (int64_t l = 0; l < a.n_layers; ++l) block("layers." + std::to_string(l) + ".", l);
  out.push_back({"norm.weight", {d}});
  out.push_back({"output.weight", {a.vocab_size, d}});
  for (int64_t k = 0; k < a.num_mtp_layers; ++k) {
    const std::string p = "mtp." + std::to_string(k) + ".";
    out.push_back({p + "enorm.weight", {d}});
    out.push_back({p + "hnorm.weight", {d}});
    out.push_back({p + "eh_proj.weight", {d, 2 * d}});
    block(p + "block.", a.n_layers + k);
    out.push_back({p + "norm.weight", {d}});
  }
  return out;
}

std::vector<std::string> hf_names(const std::string& name, const DeepSeekV3Args& a) {
  if (name == "tok_embeddings.weight") return {"model.embed_tokens.weight"};
  if (name == "norm.weight") return {"model.norm.weight"};
  if (name == "output.weight") return {"lm_head.weight"};
  // "layers.L.<rest>" -> model.layers.L.<rest'>; "mtp.K.block.<rest>" -> model.layers.<n_layers + K>.<rest'>.
  const bool is_mtp = name.rfind("mtp.", 0) == 0;
  const std::string layers = is_mtp ? "mtp." : "layers.";
  const size_t dot = name.find('.', layers.size());
  const std::string layer =
      name.rfind(layers, 0) == 0 && dot != std::string::npos ? name.substr(layers.size(), dot - layers.size()) : "";
  if (!layer.empty() && layer.find_first_not_of("0123456789") == std::string::npos) {
    std::string rest = name.substr(dot + 1), hf_prefix = "model.layers." + layer + ".";
    if (is_mtp) {
      hf_prefix = "model.layers." + std::to_string(a.n_layers + std::stoll(layer)) + ".";
      for (const auto& [ours, hf] : mtp_names())
        if (rest == ours) return {hf_prefix + hf};
      const std::string block = "block.";
      rest = rest.rfind(block, 0) == 0 ? rest.substr(block.size()) : std::string();
    }
    for (const auto& [ours, hf] : layer_names())
      if (rest == ours) return {hf_prefix + hf};
    for (const auto& [ours, proj] : expert_names()) {
      if (rest != ours) continue;
      std::vector<std::string> out;
      for (int64_t e = 0; e < a.n_routed_experts; ++e)
        out.push_back(hf_prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight");
      return out;
    }
  }
  TITAN_FAIL("deepseek_v3: parameter '" + name + "' has no Hugging Face counterpart",
             "the HF adapter's name table (deepseek_v3/hf_adapter.cpp) must list every parameter the model registers");
}

std::map<std::string, Tensor> load_hf_state(const checkpoint::HfFolder& folder, const DeepSeekV3Args& a,
                                            const std::vector<std::pair<std::string, Shape>>& wanted, bool strict) {
  std::map<std::string, Tensor> state;
  std::set<std::string> used;
  for (const auto& [name, shape] : wanted) {
    const std::vector<std::string> sources = hf_names(name, a);
    const bool stacked = sources.size() > 1 || name.find("moe.experts.") != std::string::npos;
    Shape part = shape;  // the shape each source must have
    if (stacked) part.erase(0);
    Tensor out = stacked ? Tensor::empty(shape, DType::f32, MemCategory::parameters) : Tensor();
    for (size_t i = 0; i < sources.size(); ++i) {
      const std::string& src = sources[i];
      TITAN_CHECK(folder.contains(src), "tensor '" + src + "' (for our '" + name + "') is not in the Hugging Face folder " +
                                            folder.dir().string(),
                  "the weights do not match config.json (layers, q_lora_rank, experts); check both come from one export");
      const Shape got = folder.shape(src);
      TITAN_CHECK(got == part, "tensor '" + src + "' in " + (folder.dir() / folder.file_of(src)).string() + " is " +
                                   got.str() + " but config.json implies " + part.str() + " (our '" + name + "')",
                  "the weights do not match config.json; check both come from one export");
      used.insert(src);
      if (!stacked) {
        out = folder.load_f32(src);
        continue;
      }
      Tensor slot = out.select(0, int64_t(i));
      slot.copy_(folder.load_f32(src));
    }
    state[name] = out;
  }
  if (strict) {
    for (const std::string& n : folder.names()) {
      const int64_t layer = hf_layer(n);
      bool shared_copy = false;  // an MTP layer's copy of the embedding or head
      for (const char* c : kMtpSharedCopies) shared_copy |= layer >= a.n_layers && n.ends_with(std::string(".") + c);
      const bool skipped = used.count(n) || folder.is_scale(n) || n.ends_with("rotary_emb.inv_freq") ||
                           shared_copy || layer >= a.n_layers + a.num_mtp_layers;  // MTP layers not loaded
      TITAN_CHECK(skipped, "unexpected tensor '" + n + "' in " + (folder.dir() / folder.file_of(n)).string(),
                  "config.json does not describe these weights (e.g. first_k_dense_replace or q_lora_rank differ)");
    }
  }
  return state;
}

std::unique_ptr<Transformer> load_hf_model(const fs::path& dir, const MoeFactory& moe) {
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  const DeepSeekV3Args a = args_from_hf_folder(folder);
  TITAN_CHECK(moe || a.n_dense_layers >= a.n_layers + a.num_mtp_layers,
              (dir / "config.json").string() + " has MoE layers (first_k_dense_replace " +
                  std::to_string(a.n_dense_layers) + " < num_hidden_layers " + std::to_string(a.n_layers) +
                  ") but no MoE layer was given",
              "pass a MoeFactory (models/moe) to load_hf_model");
  auto model = std::make_unique<Transformer>(a, moe);
  // Every parameter comes from the folder (hf_names throws for one without a counterpart); of
  // the buffers only the expert bias does: run-time statistics (e.g. tokens per expert) keep
  // their fresh values, hence the non-strict load of a state that covers all parameters.
  std::vector<std::pair<std::string, Shape>> wanted;
  for (const auto& [name, p] : model->named_parameters()) wanted.emplace_back(name, p->var.shape());
  for (const auto& [name, t] : model->named_buffers())
    if (name.ends_with("moe.expert_bias")) wanted.emplace_back(name, t.shape());
  model->load_state_dict(load_hf_state(folder, model->args(), wanted), /*strict=*/false, dir.string());
  return model;
}

std::vector<std::pair<std::string, Tensor>> to_hf_tensors(const std::vector<std::pair<std::string, Tensor>>& state,
                                                          const DeepSeekV3Args& a) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : state) {
    const std::vector<std::string> names = hf_names(name, a);
    if (names.size() == 1 && name.find("moe.experts.") == std::string::npos) {
      out.emplace_back(names[0], t);
      continue;
    }
    TITAN_CHECK(t.dim() >= 1 && t.size(0) == int64_t(names.size()),
                "deepseek_v3: '" + name + "' is " + t.shape().str() + " but the config has " +
                    std::to_string(names.size()) + " routed experts",
                "export with the args the model was built with");
    for (size_t e = 0; e < names.size(); ++e) out.emplace_back(names[e], t.select(0, int64_t(e)));
  }
  // DeepSeek's layout repeats the shared embedding and head in every MTP layer (vLLM and SGLang read them there).
  for (int64_t k = 0; k < a.num_mtp_layers; ++k) {
    const std::string p = "model.layers." + std::to_string(a.n_layers + k) + ".";
    for (const auto& [name, t] : state) {
      if (name == "tok_embeddings.weight") out.emplace_back(p + kMtpSharedCopies[0], t);
      if (name == "output.weight") out.emplace_back(p + kMtpSharedCopies[1], t);
    }
  }
  return out;
}

namespace {

// DeepSeek's FP8 checkpoints store every projection of the blocks (attention, indexer, MLPs,
// experts) in E4M3; the router, norms, embedding, head and the MTP's eh_proj stay high precision.
bool stored_fp8(const std::string& hf_name) {
  if (hf_name.rfind("model.layers.", 0) != 0) return false;
  if (hf_name.ends_with("indexer.wq_b.weight") || hf_name.ends_with("indexer.wk.weight")) return true;
  return hf_name.ends_with("_proj.weight") && !hf_name.ends_with("weights_proj.weight") &&
         !hf_name.ends_with("eh_proj.weight");
}

// DeepSeek-V3's release layout: each FP8 weight beside "<W>_scale_inv", f32 per 128 x 128 block;
// the rest in `dtype`.
std::vector<std::pair<std::string, Tensor>> quantize_fp8(const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                         DType dtype) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : tensors) {
    if (!stored_fp8(name)) {
      out.emplace_back(name, t.to(dtype));
      continue;
    }
    auto [codes, scale_inv] = checkpoint::quantize_fp8_blocks(t);
    out.emplace_back(name, codes);
    out.emplace_back(name + "_scale_inv", scale_inv);
  }
  return out;
}

}  // namespace

void save_hf(const fs::path& dir, const DeepSeekV3Args& a, const std::vector<std::pair<std::string, Tensor>>& state,
             const checkpoint::HfWriteOptions& options) {
  json config = hf_config_from_args(a);
  config["torch_dtype"] = options.dtype == DType::f32 ? "float32" : options.dtype == DType::f16 ? "float16" : "bfloat16";
  if (options.quantize == checkpoint::HfQuantization::none) {
    checkpoint::save_hf_folder(dir, config, to_hf_tensors(state, a), options);
    return;
  }
  TITAN_CHECK(options.quantize == checkpoint::HfQuantization::fp8, "deepseek_v3: FP4 experts are DeepSeek-V4's layout",
              "export DeepSeek-V3 / V3.2 with --quantize fp8");
  config["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}, {"fmt", "e4m3"},
                                   {"weight_block_size", {checkpoint::kFp8BlockSize, checkpoint::kFp8BlockSize}}};
  checkpoint::HfWriteOptions keep = options;
  keep.keep_dtypes = true;
  checkpoint::save_hf_folder(dir, config, quantize_fp8(to_hf_tensors(state, a), options.dtype), keep);
}

}  // namespace titan::models::deepseek_v3
