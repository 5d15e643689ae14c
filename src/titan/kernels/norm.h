// Tensor-level RMSNorm and LayerNorm over the last dim, forward and backward. x, y, dy, dx are
// [..., D] of one dtype (f32 or bf16), contiguous; w, b, dw, db are f32 [D]; the saved
// statistics mean and rstd are f32 with one value per row (N = numel / D). Backward accumulates
// (+=) into dx, dw, db; an undefined dw or db means that parameter needs no gradient.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); saves rstd
void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps);
void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& rstd, const Tensor& dy, const Tensor& x, const Tensor& w);

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps); saves mean and rstd
void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       double eps);
void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& x, const Tensor& w);

}  // namespace titan::kernels
