// Tensor-level SiLU and SwiGLU, forward and backward. All tensors of one call share shape and
// dtype (f32 or bf16) and are contiguous; backward accumulates (+=) into gradients.
#pragma once

#include <limits>

#include "titan/core/tensor.h"

namespace titan::kernels {

void silu_forward(Tensor& y, const Tensor& x);                         // y = x sigmoid(x)
void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x);     // dx += dy silu'(x)
// y = silu(gate) * up: the gated feed-forward of Llama and DeepSeek, [N, F] each.
// A finite limit (DeepSeek-V4's swiglu_limit, > 0) clamps both inputs first, as transformers does:
// y = silu(min(gate, limit)) * clamp(up, -limit, limit); each input's gradient passes where the
// clamp left it unchanged (bounds included: torch's clamp) and is 0 beyond. Infinite: plain SwiGLU.
inline constexpr double kNoSwigluLimit = std::numeric_limits<double>::infinity();
void swiglu_forward(Tensor& y, const Tensor& gate, const Tensor& up, double limit = kNoSwigluLimit);
// dgate, dup += the gradients; with accumulate false they are written (need not be initialized).
void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dy, const Tensor& gate, const Tensor& up,
                     bool accumulate = true, double limit = kNoSwigluLimit);

}  // namespace titan::kernels
