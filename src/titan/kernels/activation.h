// Tensor-level SiLU and SwiGLU, forward and backward. All tensors of one call share shape and
// dtype (f32 or bf16) and are contiguous; backward accumulates (+=) into gradients.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

void silu_forward(Tensor& y, const Tensor& x);                         // y = x sigmoid(x)
void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);     // dx += dy silu'(x)
// y = silu(gate) * up: the gated feed-forward of Llama and DeepSeek, [N, F] each
void swiglu_forward(Tensor& y, const Tensor& gate, const Tensor& up);
// dgate, dup += the gradients; with accumulate false they are written (need not be initialized).
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dy, const Tensor& gate, const Tensor& up,
                     bool accumulate = true);

}  // namespace titan::kernels
