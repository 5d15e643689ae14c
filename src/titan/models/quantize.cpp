#include "titan/models/quantize.h"

#include <map>

#include "titan/core/error.h"
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
}  // namespace

std::vector<std::pair<std::string, LowPrecision>> apply_quantize(nn::Module& model, const QuantizeOptions& q) {
  TITAN_CHECK(!q.grouped_mm, "model.converters: quantize.grouped_mm.float8 / quantize.grouped_mm.mx (the routed "
                             "experts' grouped GEMMs) are not built yet",
              "drop them from [model] converters: the routed experts then train in high precision, while "
              "quantize.linear.* covers attention, dense FFNs and shared experts (docs/precision.md)");
  std::vector<std::pair<std::string, LowPrecision>> chosen;
  if (!q.linear) return chosen;
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
    chosen.emplace_back(name, q.linear->recipe);
  });
  // apply() visits children first; report in parameter order.
  std::vector<std::pair<std::string, LowPrecision>> ordered;
  for (auto& [name, p] : model.named_parameters())
    for (const auto& c : chosen)
      if (c.first + ".weight" == name) ordered.push_back(c);
  return ordered;
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
