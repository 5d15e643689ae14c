#include "titan/models/deepseek_v4/hf_adapter.h"

#include <utility>
#include <vector>

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

}  // namespace

std::map<std::string, Tensor> state_from_hf(const std::map<std::string, Tensor>& hf, const std::string& source) {
  std::map<std::string, Tensor> ours;
  for (const auto& [hf_name, t] : hf) {
    std::string name = hf_name.rfind("model.", 0) == 0 ? hf_name.substr(6) : hf_name;
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

}  // namespace titan::models::deepseek_v4
