// Common layers.
#pragma once

#include <optional>

#include "titan/autograd/ops.h"
#include "titan/autograd/quantized_linear.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/nn/module.h"

namespace titan::nn {

// y = x @ W^T with W [out, in] (no bias, as in Llama/DeepSeek projections). With `quantize` set
// (models/quantize.h: [model] converters "quantize.linear.*"), the GEMMs run on the recipe's
// quantized operands (autograd/quantized_linear.h), the weight's forms cached per step.
class Linear : public Module {
 public:
  Linear(int64_t in, int64_t out, Init init);
  Variable forward(const Variable& x) const;
  Parameter& weight;
  std::optional<autograd::LowPrecision> quantize;
  // false: the owner reads the weight itself instead of calling forward (MLA's absorbed wkv_b,
  // V4's grouped o_a_proj, the f32 router gate), so a quantization converter leaves it alone.
  bool quantizable = true;
  mutable autograd::QuantizedWeight quantized;
};

// Token embedding table [V, D] (f32 master; rows are gathered in the compute dtype).
class Embedding : public Module {
 public:
  Embedding(int64_t vocab, int64_t dim, Init init);
  Variable forward(const Tensor& ids, DType dtype) const;
  Parameter& weight;
};

// y = x * rstd(x) * weight: the fused kernel, or its small-op form ([model] converters).
class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-5);
  Variable forward(const Variable& x) const;
  Parameter& weight;
  double eps;
  autograd::OpForm form = autograd::OpForm::fused;
};

// y = (x - mean) * rstd * weight + bias (torch.nn.LayerNorm with its affine parameters).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5);
  Variable forward(const Variable& x) const;
  Parameter &weight, &bias;
  double eps;
};

}  // namespace titan::nn
