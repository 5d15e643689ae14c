// [model] converters (TorchTitan's model converters, torchtitan-npu's per-op kernel switch):
// which form of each op that has a fused kernel runs, the fused kernel or its small-op form
// (autograd/small_op_forms.h; for DSA, deepseek_v3/dsa.h). Each family lists the ops it has
// (ModelFamily::converters); a name outside them is refused, listing the known ones.
//
// Names: "<op>_fused" and "<op>_small_ops" pick one op's form, "small_ops" the small-op form of
// every op not named "<op>_fused". Unnamed ops keep their default, which is what titan ran before
// the switch existed: fused RMSNorm, RoPE, grouped GEMM and MoE permute, small-op DSA (its fused
// kernels are opt-in, as `converters = ["dsa_fused"]` always was). docs/converters.md says why
// and measures each pair.
#pragma once

#include <string>
#include <vector>

#include "titan/autograd/small_op_forms.h"
#include "titan/kernels/rope.h"
#include "titan/nn/module.h"

namespace titan::models {

using autograd::OpForm;

// The ops a converter can switch, by their names in [model] converters.
inline constexpr const char* kConverterRmsNorm = "rms_norm";
inline constexpr const char* kConverterRope = "rope";
inline constexpr const char* kConverterGroupedMm = "grouped_mm";
inline constexpr const char* kConverterPermute = "permute";  // MoE permute and unpermute
inline constexpr const char* kConverterDsa = "dsa";          // DeepSeek Sparse Attention
inline constexpr const char* kConverterHyperConnection = "hyper_connection";  // DeepSeek-V4's mHC maps
inline constexpr const char* kConverterCompressor = "compressor";             // DeepSeek-V4's compressors

struct Converters {
  OpForm rms_norm = OpForm::fused;
  OpForm rope = OpForm::fused;
  OpForm grouped_mm = OpForm::fused;
  OpForm permute = OpForm::fused;
  OpForm dsa = OpForm::small_ops;
  OpForm hyper_connection = OpForm::fused;
  OpForm compressor = OpForm::fused;
};

// The forms `names` ([model] converters) select for a model with these ops. Throws for a name
// that is not one of converter_names(ops), and for an op named both fused and small_ops.
Converters converters_from_names(const std::vector<std::string>& names, const std::string& model,
                                 const std::vector<std::string>& ops);
// Every name a model with these ops accepts: <op>_fused and <op>_small_ops per op, small_ops.
std::vector<std::string> converter_names(const std::vector<std::string>& ops);

// A module that applies RoPE: the form it runs in, set by apply_converters.
class AppliesRope {
 public:
  virtual ~AppliesRope() = default;
  OpForm rope_form = OpForm::fused;

 protected:
  autograd::Variable apply_rope(const autograd::Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
                                kernels::RopeLayout layout, int64_t rope_offset = 0) const;
};

// A module that runs one switchable op (named by converter_op(), e.g. kConverterHyperConnection):
// the form it runs in, set by apply_converters.
class SwitchableOp {
 public:
  virtual ~SwitchableOp() = default;
  virtual const char* converter_op() const = 0;
  OpForm form = OpForm::fused;
};

// Sets the forms on every module of the model that runs one of these ops (RMSNorm, the RoPE
// users, MoE layers, SwitchableOp modules). DSA's form is the family's to pass (its schedule, deepseek_v3/family.cpp).
void apply_converters(nn::Module& model, const Converters& c);

}  // namespace titan::models
