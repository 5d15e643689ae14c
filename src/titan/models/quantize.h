// Quantization converters ([model] converters "quantize.*", TorchTitan's TOML-era names and
// sections; docs/precision.md): which modules train under which low-precision recipe.
//
//   quantize.linear.float8      every quantizable nn::Linear not matched by filter_fqns, FP8 blockwise
//   quantize.linear.mx          the same, MXFP8 or MXFP4
//   quantize.grouped_mm.float8  the routed experts matched by fqns, FP8 blockwise per expert
//   quantize.grouped_mm.mx      the same, MXFP8 or MXFP4 per expert
//
// A name matches when it contains one of the strings (TorchTitan's rule). Embeddings, norms, the
// MoE router, mHC maps and every weight an owner reads itself (nn::Linear::quantizable false) stay
// in high precision; so does the output head under the default filter_fqns = ["output"]. Master
// weights, gradients and the optimizer stay f32.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "titan/autograd/quantized_linear.h"
#include "titan/nn/module.h"

namespace titan::models {

inline constexpr const char* kQuantizeLinearFloat8 = "quantize.linear.float8";
inline constexpr const char* kQuantizeLinearMx = "quantize.linear.mx";
inline constexpr const char* kQuantizeGroupedMmFloat8 = "quantize.grouped_mm.float8";
inline constexpr const char* kQuantizeGroupedMmMx = "quantize.grouped_mm.mx";

// A converter name of the quantize.* family (known or not): converters_from_names leaves these to
// quantize_options.
bool is_quantize_converter(const std::string& name);

// One converter's selection: the recipe and the name filter.
struct QuantizeSelection {
  autograd::LowPrecision recipe = autograd::LowPrecision::fp8_blockwise;
  std::vector<std::string> fqns;  // linear: skipped (filter_fqns); grouped_mm: selected (fqns)
};

struct QuantizeOptions {
  std::optional<QuantizeSelection> linear, grouped_mm;
  bool any() const { return linear || grouped_mm; }
  bool operator==(const QuantizeOptions&) const;
};

// The recipe a recipe_name key names ("blockwise", "mxfp8", "mxfp4"), for converter `converter`.
autograd::LowPrecision quantize_recipe(const std::string& converter, const std::string& recipe_name);
std::string_view recipe_label(autograd::LowPrecision r);  // "fp8_blockwise", "mxfp8", "mxfp4"

// Sets each selected module's recipe; returns "<module name>: <recipe>" for every module it
// quantized, in model order (the trainer prints it; tests check it). Throws when a grouped_mm
// converter is on but the model has no routed experts, or when a filter matches nothing.
std::vector<std::pair<std::string, autograd::LowPrecision>> apply_quantize(nn::Module& model, const QuantizeOptions& q);

// The weight forms of every Linear apply_quantize set to FP8 blockwise, by their weight's parameter
// name: what FSDP's FP8 all-gather ([quantize.linear.float8] enable_fsdp_float8_all_gather) feeds.
std::map<std::string, autograd::QuantizedWeight*> fp8_blockwise_weights(nn::Module& model);
// The modules a model trains quantized now (as apply_quantize returns them): each Linear by its
// name, each MoE's routed experts as "<layer>.moe.experts".
std::vector<std::pair<std::string, autograd::LowPrecision>> quantized_modules(nn::Module& model);
// The same, a line per recipe and kind ("quantized fp8_blockwise: 24 linear layers (...)", "quantized
// mxfp4: the routed experts of 5 MoE layers (...)"); empty when nothing is quantized.
std::string describe_quantized(nn::Module& model);

}  // namespace titan::models
