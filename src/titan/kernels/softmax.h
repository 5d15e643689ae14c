// Tensor-level softmax over the last dim, forward and backward. Tensors share shape [..., D] and
// dtype (f32 or bf16) and are contiguous; backward accumulates (+=) into dx.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

void softmax_forward(Tensor& y, const Tensor& x);
void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y);  // from the forward's output y

}  // namespace titan::kernels
