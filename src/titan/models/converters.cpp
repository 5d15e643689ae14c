#include "titan/models/converters.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/moe/moe.h"
#include "titan/models/quantize.h"
#include "titan/nn/layers.h"

namespace titan::models {

namespace {
// The field of c that holds op's form (null for an op titan does not know); C is Converters or
// const Converters.
template <class C>
auto form_of(C& c, const std::string& op) -> decltype(&c.rms_norm) {
  if (op == kConverterRmsNorm) return &c.rms_norm;
  if (op == kConverterRope) return &c.rope;
  if (op == kConverterGroupedMm) return &c.grouped_mm;
  if (op == kConverterPermute) return &c.permute;
  if (op == kConverterDsa) return &c.dsa;
  if (op == kConverterHyperConnection) return &c.hyper_connection;
  if (op == kConverterCompressor) return &c.compressor;
  return nullptr;
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}
}  // namespace

std::vector<std::string> converter_names(const std::vector<std::string>& ops) {
  std::vector<std::string> names;
  for (const std::string& op : ops) names.insert(names.end(), {op + "_fused", op + "_small_ops"});
  if (!ops.empty()) names.push_back("small_ops");
  return names;
}

Converters converters_from_names(const std::vector<std::string>& names, const std::string& model,
                                 const std::vector<std::string>& ops) {
  const std::vector<std::string> known = converter_names(ops);
  const std::vector<std::string> quantize = {kQuantizeLinearFloat8, kQuantizeLinearMx, kQuantizeGroupedMmFloat8,
                                             kQuantizeGroupedMmMx};
  for (const std::string& n : names) {
    if (is_quantize_converter(n)) {  // models/quantize.h applies these
      TITAN_CHECK(std::find(quantize.begin(), quantize.end(), n) != quantize.end(),
                  "model.converters: '" + n + "' is not a quantization converter",
                  "the quantization converters: " + joined(quantize) + " (docs/precision.md)");
      continue;
    }
    TITAN_CHECK(std::find(known.begin(), known.end(), n) != known.end(),
                "model.converters: '" + n + "' is not a converter of model " + model,
                known.empty() ? "remove model.converters (model " + model + " has no op with a fused and a small-op form)"
                              : "known converters of " + model + ": " + joined(known) + " (docs/converters.md)");
  }
  Converters c;
  const bool all_small = std::find(names.begin(), names.end(), "small_ops") != names.end();
  for (const std::string& op : ops) {
    const bool fused = std::find(names.begin(), names.end(), op + "_fused") != names.end();
    const bool small = std::find(names.begin(), names.end(), op + "_small_ops") != names.end();
    TITAN_CHECK(!(fused && small), "model.converters names both " + op + "_fused and " + op + "_small_ops",
                "keep one of them");
    OpForm* form = form_of(c, op);
    TITAN_CHECK(form, "model " + model + " lists the converter op '" + op + "', which titan does not know",
                "a family's converters are among rms_norm, rope, grouped_mm, permute, dsa, hyper_connection, compressor "
                "(models/converters.h)");
    if (fused)
      *form = OpForm::fused;
    else if (small || all_small)
      *form = OpForm::small_ops;
  }
  return c;
}

autograd::Variable AppliesRope::apply_rope(const autograd::Variable& x, const kernels::RopeTables& tables,
                                           const Tensor& positions, kernels::RopeLayout layout, int64_t rope_offset) const {
  return rope_form == OpForm::fused ? autograd::rope(x, tables, positions, layout, rope_offset)
                                    : autograd::rope_small_ops(x, tables, positions, layout, rope_offset);
}

void apply_converters(nn::Module& model, const Converters& c) {
  model.apply([&](nn::Module& m) {
    if (auto* norm = dynamic_cast<nn::RMSNorm*>(&m)) norm->form = c.rms_norm;
    if (auto* rope = dynamic_cast<AppliesRope*>(&m)) rope->rope_form = c.rope;
    if (auto* moe = dynamic_cast<moe::MoE*>(&m)) moe->set_forms(c.grouped_mm, c.permute);
    if (auto* op = dynamic_cast<SwitchableOp*>(&m)) {
      const OpForm* form = form_of(c, op->converter_op());
      TITAN_CHECK(form, std::string("apply_converters: a module runs the unknown op '") + op->converter_op() + "'");
      op->form = *form;
    }
  });
}

}  // namespace titan::models
