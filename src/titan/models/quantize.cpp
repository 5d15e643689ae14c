#include "titan/models/quantize.h"

#include <map>

#include "titan/core/error.h"
#include "titan/models/moe/moe.h"
#include "titan/nn/layers.h"

namespace titan::models {

using autograd::LowPrecision;

bool is_quantize_converter(const std::string& name) { return name.rfind("quantize.", 0) == 0; }

bool QuantizeOptions::operator==(const QuantizeOptions& o) const {
  auto same = [](const std::optional<QuantizeSelection>& a, const std::optional<QuantizeSelection>& b) {
    return a.has_value() == b.has_value() && (!a || (a->recipe == b->recipe && a->fqns == b->fqns));
  };
  return same(linear, o.linear) && same(grouped_mm, o.grouped_mm);
}

LowPrecision quantize_recipe(const std::string& converter, const std::string& recipe_name) {
  const bool float8 = converter == kQuantizeLinearFloat8 || converter == kQuantizeGroupedMmFloat8;
  if (float8 && recipe_name == "blockwise") return LowPrecision::fp8_blockwise;
  if (!float8 && recipe_name == "mxfp8") return LowPrecision::mxfp8;
  if (!float8 && recipe_name == "mxfp4") return LowPrecision::mxfp4;
  TITAN_FAIL("[" + converter + "] recipe_name = \"" + recipe_name + "\" is not a recipe of " + converter,
             float8 ? "set recipe_name = \"blockwise\" (DeepSeek-V3's FP8 tiles)" : "set recipe_name = \"mxfp8\" or \"mxfp4\"");
}

std::string_view recipe_label(LowPrecision r) {
  switch (r) {
    case LowPrecision::fp8_blockwise: return "fp8_blockwise";
    case LowPrecision::mxfp8: return "mxfp8";
    case LowPrecision::mxfp4: return "mxfp4";
  }
  return "?";
}

namespace {
bool contains_any(const std::string& name, const std::vector<std::string>& parts) {
  for (const std::string& p : parts)
    if (name.find(p) != std::string::npos) return true;
  return false;
}

// The routed experts named by q.grouped_mm's fqns take its recipe (the rest none); their names
// (the GroupedExperts module's) look like "layers.1.moe.experts".
void quantize_experts(nn::Module& model, const QuantizeOptions& q) {
  std::map<const nn::Parameter*, std::string> names;  // w1 -> its module's name
  for (auto& [name, p] : model.named_parameters()) names[p] = name.substr(0, name.size() - std::string(".w1").size());
  int64_t layers = 0, selected_layers = 0;
  model.apply([&](nn::Module& m) {
    auto* moe = dynamic_cast<moe::MoE*>(&m);
    if (!moe) return;
    ++layers;
    const std::string& name = names.at(&moe->experts.w1);
    const bool selected = q.grouped_mm && contains_any(name, q.grouped_mm->fqns);
    moe->set_quantize(selected ? std::optional<LowPrecision>(q.grouped_mm->recipe) : std::nullopt);
    selected_layers += selected;
  });
  if (!q.grouped_mm) return;
  const std::string converter = q.grouped_mm->recipe == LowPrecision::fp8_blockwise ? kQuantizeGroupedMmFloat8 : kQuantizeGroupedMmMx;
  TITAN_CHECK(layers > 0, "model.converters names " + converter + ", but the model has no routed experts",
              "drop " + converter + " from [model] converters (quantize.linear.* covers dense models), or train a "
              "mixture-of-experts model (deepseek_v3, deepseek_v32, deepseek_v4)");
  std::string fqns;
  for (const std::string& f : q.grouped_mm->fqns) fqns += (fqns.empty() ? "\"" : ", \"") + f + "\"";
  TITAN_CHECK(selected_layers > 0,
              "[" + converter + "] fqns = [" + fqns + "] matches none of the routed experts (named like \"layers.1.moe.experts\")",
              "set [" + converter + "] fqns = [\"experts\"] (the default: every MoE layer's routed experts)");
}

}  // namespace

std::vector<std::pair<std::string, LowPrecision>> apply_quantize(nn::Module& model, const QuantizeOptions& q) {
  if (q.linear) {
    // A Linear's name is its weight's without ".weight".
    std::map<const nn::Parameter*, std::string> names;
    for (auto& [name, p] : model.named_parameters()) names[p] = name.substr(0, name.size() - std::string(".weight").size());
    model.apply([&](nn::Module& m) {
      auto* linear = dynamic_cast<nn::Linear*>(&m);
      if (!linear || !linear->quantizable) return;
      const std::string& name = names.at(&linear->weight);
      linear->quantize.reset();
      if (contains_any(name, q.linear->fqns)) return;
      linear->quantize = q.linear->recipe;
    });
  }
  quantize_experts(model, q);
  return quantized_modules(model);
}

std::vector<std::pair<std::string, LowPrecision>> quantized_modules(nn::Module& model) {
  // A Linear by its weight, the routed experts by w1; listed in parameter order (apply() visits
  // children first).
  std::map<const nn::Parameter*, LowPrecision> recipe_of;
  model.apply([&](nn::Module& m) {
    if (auto* linear = dynamic_cast<nn::Linear*>(&m); linear && linear->quantize) recipe_of[&linear->weight] = *linear->quantize;
    if (auto* moe = dynamic_cast<moe::MoE*>(&m); moe && moe->quantize()) recipe_of[&moe->experts.w1] = *moe->quantize();
  });
  std::vector<std::pair<std::string, LowPrecision>> out;
  for (auto& [name, p] : model.named_parameters())
    if (auto it = recipe_of.find(p); it != recipe_of.end()) out.emplace_back(name.substr(0, name.rfind('.')), it->second);
  return out;
}

std::string describe_quantized(nn::Module& model) {
  std::string text;
  for (LowPrecision r : {LowPrecision::fp8_blockwise, LowPrecision::mxfp8, LowPrecision::mxfp4}) {
    std::string linears, experts;
    int64_t n_linears = 0, n_experts = 0;
    for (const auto& [name, recipe] : quantized_modules(model)) {
      if (recipe != r) continue;
      const bool routed = name.size() >= 8 && name.compare(name.size() - 8, 8, ".experts") == 0;
      std::string& list = routed ? experts : linears;
      list += (list.empty() ? "" : ", ") + name;
      ++(routed ? n_experts : n_linears);
    }
    const std::string label(recipe_label(r));
    if (n_linears > 0) text += "quantized " + label + ": " + std::to_string(n_linears) + " linear layers (" + linears + ")\n";
    if (n_experts > 0) text += "quantized " + label + ": the routed experts of " + std::to_string(n_experts) + " MoE layers (" + experts + ")\n";
  }
  return text;
}

std::map<std::string, autograd::QuantizedWeight*> fp8_blockwise_weights(nn::Module& model) {
  std::map<const nn::Parameter*, std::string> names;
  for (auto& [name, p] : model.named_parameters()) names[p] = name;
  std::map<std::string, autograd::QuantizedWeight*> out;
  model.apply([&](nn::Module& m) {
    auto* linear = dynamic_cast<nn::Linear*>(&m);
    if (linear && linear->quantize == LowPrecision::fp8_blockwise) out[names.at(&linear->weight)] = &linear->quantized;
  });
  return out;
}

}  // namespace titan::models
