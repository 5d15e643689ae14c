#include "titan/nn/layers.h"

namespace titan::nn {

Linear::Linear(int64_t in, int64_t out, Init init) : weight(register_parameter("weight", {out, in}, init)) {
  weight.gemm_weight = true;
}

Variable Linear::forward(const Variable& x) const {
  UnitScope unit(*this);  // an output head can be a unit of a parallel plan (FSDP)
  if (quantize)
    return autograd::quantized_linear(x, weight.var, weight.compute.defined() ? weight.compute : weight.var.value(),
                                      *quantize, quantized);
  return autograd::linear(x, weight.var, weight.compute);
}

Embedding::Embedding(int64_t vocab, int64_t dim, Init init) : weight(register_parameter("weight", {vocab, dim}, init)) {
  weight.vocabulary = true;
}

Variable Embedding::forward(const Tensor& ids, DType dtype) const {
  UnitScope unit(*this);  // the token embedding is a unit of a parallel plan (FSDP)
  return autograd::embedding(ids, weight.var, dtype);
}

RMSNorm::RMSNorm(int64_t dim, double eps_)
    : weight(register_parameter("weight", {dim}, Init::ones(), /*weight_decay=*/false)), eps(eps_) {}

Variable RMSNorm::forward(const Variable& x) const {
  return form == autograd::OpForm::fused ? autograd::rmsnorm(x, weight.var, eps)
                                         : autograd::rmsnorm_small_ops(x, weight.var, eps);
}

LayerNorm::LayerNorm(int64_t dim, double eps_)
    : weight(register_parameter("weight", {dim}, Init::ones(), /*weight_decay=*/false)),
      bias(register_parameter("bias", {dim}, Init::zeros(), /*weight_decay=*/false)),
      eps(eps_) {}

Variable LayerNorm::forward(const Variable& x) const { return autograd::layernorm(x, weight.var, bias.var, eps); }

}  // namespace titan::nn
