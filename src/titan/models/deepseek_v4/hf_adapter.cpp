#include "titan/models/deepseek_v4/hf_adapter.h"

#include <utility>
#include <vector>

#include "titan/checkpoint/hf.h"
#include "titan/core/error.h"

namespace titan::models::deepseek_v4 {

namespace {

// Renamed suffixes, ours <-> transformers' (after the "model." prefix is handled).
const std::vector<std::pair<std::string, std::string>>& renames() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"hc_head.fn", "hc_head.hc_fn"},
      {"hc_head.base", "hc_head.hc_base"},
      {"hc_head.scale", "hc_head.hc_scale"},
      {"mlp.router.gate.weight", "mlp.gate.weight"},
      {"mlp.expert_bias", "mlp.gate.e_score_correction_bias"},
      {"mlp.tid2eid", "mlp.gate.tid2eid"},
      {"mlp.experts.w2", "mlp.experts.down_proj"},
      {"mlp.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"mlp.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"mlp.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
  };
  return r;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// name with its suffix `from` replaced by `to` (when it ends so).
bool replace_suffix(std::string& name, const std::string& from, const std::string& to) {
  if (!ends_with(name, from)) return false;
  name = name.substr(0, name.size() - from.size()) + to;
  return true;
}

constexpr const char* kGateUp = "mlp.experts.gate_up_proj";

// Every occurrence of `from` in name replaced by `to`.
void replace_all(std::string& name, const std::string& from, const std::string& to) {
  for (size_t at = name.find(from); at != std::string::npos; at = name.find(from, at + to.size()))
    name.replace(at, from.size(), to);
}

// Whole parts of a layer's names, DeepSeek's <-> transformers', in the order a name is rewritten
// either way (the indexer moves under the compressor, its own compressor's parts up into it: its
// two projections are renamed before the rest of it moves, then the rest of the attention).
const std::vector<std::pair<std::string, std::string>>& layer_parts() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {".attn.indexer.wq_b.", ".self_attn.compressor.indexer.q_b_proj."},
      {".attn.indexer.weights_proj.", ".self_attn.compressor.indexer.scorer.weights_proj."},
      {".attn.indexer.compressor.", ".self_attn.compressor.indexer."},
      {".attn.", ".self_attn."},
      {".ffn.", ".mlp."},
      {".attn_norm.", ".input_layernorm."},
      {".ffn_norm.", ".post_attention_layernorm."},
      {".hc_attn_", ".attn_hc."},
      {".hc_ffn_", ".ffn_hc."},
  };
  return r;
}

// Renamed endings of a layer's names, DeepSeek's <-> transformers' (after layer_parts).
const std::vector<std::pair<std::string, std::string>>& layer_tails() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"self_attn.attn_sink", "self_attn.sinks"},          {"self_attn.wq_a.weight", "self_attn.q_a_proj.weight"},
      {"self_attn.q_norm.weight", "self_attn.q_a_norm.weight"}, {"self_attn.wq_b.weight", "self_attn.q_b_proj.weight"},
      {"self_attn.wkv.weight", "self_attn.kv_proj.weight"},    {"self_attn.norm.weight", "self_attn.kv_norm.weight"},
      {"self_attn.wo_a.weight", "self_attn.o_a_proj.weight"},  {"self_attn.wo_b.weight", "self_attn.o_b_proj.weight"},
      {"compressor.wkv.weight", "compressor.kv_proj.weight"},  {"compressor.wgate.weight", "compressor.gate_proj.weight"},
      {"compressor.ape", "compressor.position_bias"},          {"compressor.norm.weight", "compressor.kv_norm.weight"},
      {"indexer.wkv.weight", "indexer.kv_proj.weight"},        {"indexer.wgate.weight", "indexer.gate_proj.weight"},
      {"indexer.ape", "indexer.position_bias"},                {"indexer.norm.weight", "indexer.kv_norm.weight"},
      {"mlp.gate.bias", "mlp.gate.e_score_correction_bias"},
      {"mlp.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight"},
      {"mlp.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight"},
      {"mlp.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight"},
      {"hc_head_fn", "hc_head.hc_fn"},  // an MTP module's own HyperHead ("mtp.K.hc_head_fn")
      {"hc_head_base", "hc_head.hc_base"},
      {"hc_head_scale", "hc_head.hc_scale"},
  };
  return r;
}

// A layer's name, or an MTP module's (a layer with a few tensors of its own): "layers.L." / "mtp.K.".
bool in_a_layer(const std::string& name) { return name.rfind("layers.", 0) == 0 || name.rfind("mtp.", 0) == 0; }

// Global names, DeepSeek's <-> transformers' (without "model.").
const std::vector<std::pair<std::string, std::string>>& global_names() {
  static const std::vector<std::pair<std::string, std::string>> r = {
      {"head.weight", "lm_head.weight"},   {"embed.weight", "embed_tokens.weight"}, {"hc_head_fn", "hc_head.hc_fn"},
      {"hc_head_base", "hc_head.hc_base"}, {"hc_head_scale", "hc_head.hc_scale"},
  };
  return r;
}

// transformers' name (without "model.") of a tensor in DeepSeek's naming, which the release uses
// and save_pretrained writes back (spec 6.2); a transformers' name comes back unchanged.
std::string from_deepseek_naming(std::string name) {
  for (const auto& [deepseek, hf] : global_names())
    if (name == deepseek) return hf;
  if (!in_a_layer(name)) return name;
  for (const auto& [deepseek, hf] : layer_parts()) replace_all(name, deepseek, hf);
  for (const auto& [deepseek, hf] : layer_tails())
    if (replace_suffix(name, deepseek, hf)) break;
  return name;
}

// The inverse: DeepSeek's name of a transformers' one (without "model.").
std::string to_deepseek_naming(std::string name) {
  for (const auto& [deepseek, hf] : global_names())
    if (name == hf) return deepseek;
  if (!in_a_layer(name)) return name;
  for (const auto& [deepseek, hf] : layer_tails())
    if (replace_suffix(name, hf, deepseek)) break;
  for (const auto& [deepseek, hf] : layer_parts()) replace_all(name, hf, deepseek);
  return name;
}

// DeepSeek's per-expert matrices "mlp.experts.E.wK.weight", stacked over E into our
// "mlp.experts.wK" [E, ...] (K = 1, 2, 3); other names are left to the caller.
bool stack_expert(const std::string& name, const Tensor& t, std::map<std::string, std::map<int64_t, Tensor>>& stacks) {
  const size_t at = name.find("mlp.experts.");
  if (at == std::string::npos || !ends_with(name, ".weight")) return false;
  const std::string rest = name.substr(at + 12);  // "E.wK.weight"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || rest.find_first_not_of("0123456789") != dot) return false;
  stacks[name.substr(0, at + 12) + rest.substr(dot + 1, rest.size() - dot - 1 - 7)][std::stoll(rest.substr(0, dot))] = t;
  return true;
}

}  // namespace

std::map<std::string, Tensor> state_from_hf(const std::map<std::string, Tensor>& hf, const std::string& source) {
  std::map<std::string, Tensor> ours;
  std::map<std::string, std::map<int64_t, Tensor>> stacks;  // our name -> expert -> its matrix
  for (const auto& [hf_name, t] : hf) {
    std::string name = from_deepseek_naming(hf_name.rfind("model.", 0) == 0 ? hf_name.substr(6) : hf_name);
    if (stack_expert(name, t, stacks)) continue;
    if (replace_suffix(name, kGateUp, "")) {
      TITAN_CHECK(t.dim() == 3 && t.size(1) % 2 == 0,
                  source + ": " + hf_name + " must be [E, 2F, d], got " + t.shape().str());
      const int64_t f = t.size(1) / 2;
      ours[name + "mlp.experts.w1"] = t.slice(1, 0, f).contiguous();
      ours[name + "mlp.experts.w3"] = t.slice(1, f, 2 * f).contiguous();
      continue;
    }
    for (const auto& [mine, theirs] : renames())
      if (replace_suffix(name, theirs, mine)) break;
    ours[name] = t;
  }
  for (const auto& [name, experts] : stacks) {
    const Tensor& first = experts.begin()->second;
    Tensor stacked = Tensor::empty({int64_t(experts.size()), first.size(0), first.size(1)}, first.dtype());
    int64_t e = 0;
    for (const auto& [index, w] : experts) {
      TITAN_CHECK(index == e && w.shape() == first.shape(),
                  source + ": the experts of " + name + " are not 0.." + std::to_string(experts.size() - 1) +
                      " of one shape (expert " + std::to_string(index) + " is " + w.shape().str() + ")",
                  "convert a folder holding every expert's w1, w2 and w3");
      stacked.select(0, e++).copy_(w);
    }
    ours[name] = stacked;
  }
  return ours;
}

std::map<std::string, Tensor> state_to_hf(const std::map<std::string, Tensor>& ours) {
  std::map<std::string, Tensor> hf;
  for (const auto& [our_name, t] : ours) {
    std::string name = our_name;
    if (ends_with(name, "mlp.experts.w3")) continue;  // joined with w1 below
    if (replace_suffix(name, "mlp.experts.w1", kGateUp)) {
      const Tensor& up = ours.at(our_name.substr(0, our_name.size() - 2) + "w3");
      Tensor joined = Tensor::empty({t.size(0), t.size(1) + up.size(1), t.size(2)}, t.dtype());
      joined.slice(1, 0, t.size(1)).copy_(t);
      joined.slice(1, t.size(1), t.size(1) + up.size(1)).copy_(up);
      hf["model." + name] = joined;
      continue;
    }
    for (const auto& [mine, theirs] : renames())
      if (replace_suffix(name, mine, theirs)) break;
    hf[name == "lm_head.weight" ? name : "model." + name] = t;
  }
  return hf;
}

namespace {

// The release's storage of a tensor by its DeepSeek name (spec 6.4; what V4-Flash ships).
enum class Storage { f32, bf16, fp8, expert };

Storage release_storage(const std::string& name) {
  static const std::vector<std::string> fp8 = {
      ".attn.wq_a.weight", ".attn.wq_b.weight", ".attn.wkv.weight", ".attn.wo_a.weight", ".attn.wo_b.weight",
      ".shared_experts.w1.weight", ".shared_experts.w2.weight", ".shared_experts.w3.weight",
      ".e_proj.weight", ".h_proj.weight"};  // MTP's projections
  static const std::vector<std::string> bf16 = {
      "compressor.wkv.weight", "compressor.wgate.weight", "indexer.wq_b.weight", "indexer.weights_proj.weight",
      ".ffn.gate.weight"};
  if (name == "embed.weight" || name == "head.weight") return Storage::bf16;
  if (name.find(".ffn.experts.") != std::string::npos) return Storage::expert;
  for (const std::string& tail : fp8)
    if (ends_with(name, tail)) return Storage::fp8;
  for (const std::string& tail : bf16)
    if (ends_with(name, tail)) return Storage::bf16;
  return Storage::f32;  // norms, mHC, sinks, position biases, the router's bias (and the i64 hash table)
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> state_to_release(const std::map<std::string, Tensor>& ours, bool fp4_experts) {
  std::vector<std::pair<std::string, Tensor>> full;  // DeepSeek's names, our values
  for (const auto& [our_name, t] : ours) {
    std::string name = our_name;
    bool experts = false;
    for (const char* k : {"w1", "w2", "w3"}) {
      if (!replace_suffix(name, std::string("mlp.experts.") + k, "ffn.experts.")) continue;
      for (int64_t e = 0; e < t.size(0); ++e)
        full.emplace_back(name + std::to_string(e) + "." + k + ".weight", t.select(0, e).contiguous());
      experts = true;
      break;
    }
    if (experts) continue;
    for (const auto& [mine, theirs] : renames())
      if (replace_suffix(name, mine, theirs)) break;
    full.emplace_back(to_deepseek_naming(name), t);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, t] : full) {
    const Storage s = release_storage(name);
    if (t.dtype() == DType::i64 || s == Storage::f32) {
      out.emplace_back(name, t.dtype() == DType::i64 ? t : t.to(DType::f32));
    } else if (s == Storage::bf16) {
      out.emplace_back(name, t.to(DType::bf16));
    } else {
      auto [codes, scales] = s == Storage::expert && fp4_experts
                                 ? checkpoint::quantize_fp4_rows(t)
                                 : checkpoint::quantize_fp8_blocks(t, checkpoint::kFp8BlockSize, kernels::ScaleRule::pow2);
      out.emplace_back(name, codes);
      out.emplace_back(name.substr(0, name.size() - 6) + "scale", scales);  // "<X>.weight" -> "<X>.scale"
    }
  }
  return out;
}

}  // namespace titan::models::deepseek_v4
