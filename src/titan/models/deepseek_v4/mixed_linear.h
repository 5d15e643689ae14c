#pragma once

#include "titan/autograd/ops.h"
#include "titan/nn/layers.h"

namespace titan::models::deepseek_v4 {

// Mixed precision in V4: the mHC streams, the norms, RoPE and the fused attention, compressor,
// indexer and Sinkhorn kernels stay f32 (spec section 7 keeps their math f32); only the GEMMs read
// bf16. So a Linear whose weight has a bf16 compute copy casts its f32 input to bf16 and its
// product back to f32: activations between GEMMs stay f32, the GEMM runs at the bf16 rate.
inline Variable mixed_linear(const Variable& x, const Variable& w, const Tensor& w_compute) {
  if (!w_compute.defined() || x.dtype() == w_compute.dtype()) return autograd::linear(x, w, w_compute);
  return autograd::cast(autograd::linear(autograd::cast(x, w_compute.dtype()), w, w_compute), x.dtype());
}

inline Variable mixed_linear(const nn::Linear& l, const Variable& x) {
  nn::UnitScope unit(l);  // as nn::Linear::forward: an output head can be a unit of a parallel plan
  return mixed_linear(x, l.weight.var, l.weight.compute);
}

}  // namespace titan::models::deepseek_v4
