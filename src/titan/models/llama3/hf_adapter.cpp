#include "titan/models/llama3/hf_adapter.h"

#include <regex>
#include <utility>

namespace titan::models::llama3 {
namespace {

// (ours, HF) for the per-layer parameters, after the "layers.N." / "model.layers.N." prefix.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
    {"feed_forward.w3.weight", "mlp.up_proj.weight"},
    {"feed_forward.w2.weight", "mlp.down_proj.weight"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
};
constexpr std::pair<const char*, const char*> kTopNames[] = {
    {"tok_embeddings.weight", "model.embed_tokens.weight"},
    {"norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

std::optional<std::string> convert(const std::string& name, bool to_hf) {
  for (const auto& [ours, hf] : kTopNames)
    if (name == (to_hf ? ours : hf)) return std::string(to_hf ? hf : ours);
  static const std::regex ours_layer(R"(^layers\.(\d+)\.(.+)$)"), hf_layer(R"(^model\.layers\.(\d+)\.(.+)$)");
  std::smatch m;
  if (!std::regex_match(name, m, to_hf ? ours_layer : hf_layer)) return std::nullopt;
  for (const auto& [ours, hf] : kLayerNames) {
    if (m[2] != (to_hf ? ours : hf)) continue;
    return (to_hf ? "model.layers." : "layers.") + m[1].str() + "." + (to_hf ? hf : ours);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> to_hf_name(const std::string& ours) { return convert(ours, true); }
std::optional<std::string> from_hf_name(const std::string& hf) { return convert(hf, false); }

}  // namespace titan::models::llama3
