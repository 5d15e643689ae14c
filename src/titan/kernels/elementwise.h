// Tensor-level element-wise ops of a transformer block and their backward. All activations of
// one call share shape and dtype (f32 or bf16) and are contiguous. Backward accumulates (+=);
// an undefined gradient tensor means that input needs none.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// y = a + alpha * b. y may be a or b: add(h, h, branch) is the in-place residual add.
void add(Tensor& y, const Tensor& a, const Tensor& b, double alpha = 1.0);
void add_backward(Tensor& da, Tensor& db, const Tensor& dy, double alpha = 1.0);  // da += dy; db += alpha dy
// y = a * b
void mul(Tensor& y, const Tensor& a, const Tensor& b);
void mul_backward(Tensor& da, Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b);  // da += dy b; db += dy a
// y = alpha * x (y may be x). Backward: axpby(dx, dy, alpha, 1).
void scale(Tensor& y, const Tensor& x, double alpha);
// y = alpha * x + beta * y
void axpby(Tensor& y, const Tensor& x, double alpha, double beta);

}  // namespace titan::kernels
