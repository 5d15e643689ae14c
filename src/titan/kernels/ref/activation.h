// Reference: SiLU and the fused SwiGLU gate of Llama/DeepSeek feed-forward blocks, forward and
// backward. silu(x) = x * sigmoid(x). Backward accumulates (+=) into gradients.
//
// SwiGLU's limit (DeepSeek-V4's swiglu_limit; infinite: none) clamps its inputs first, as
// transformers' DeepseekV4Experts does: g = min(gate, limit), u = clamp(up, -limit, limit). The
// gradient passes where an input is not beyond its bounds (at a bound too, as torch's clamp).
#pragma once

#include <cstdint>
#include <limits>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y = silu(x)
template <class T>
void silu_forward(T* y,        // [n]
                  const T* x,  // [n]
                  int64_t n);
// dx += dy * silu'(x), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x)
template <class T>
void silu_backward(T* dx,        // [n]
                   const T* dy,  // [n]
                   const T* x,   // [n]
                   int64_t n);
// y = silu(g) * u, the two halves of the feed-forward's first projection (n = N * F)
template <class T>
void swiglu_forward(T* y,           // [N, F]
                    const T* gate,  // [N, F]
                    const T* up,    // [N, F]
                    int64_t n, acc_t<T> limit = std::numeric_limits<acc_t<T>>::infinity());
// dgate += dy * u * silu'(g) where gate <= limit; dup += dy * silu(g) where |up| <= limit
template <class T>
void swiglu_backward(T* dgate,       // [N, F]
                     T* dup,         // [N, F]
                     const T* dy,    // [N, F]
                     const T* gate,  // [N, F]
                     const T* up,    // [N, F]
                     int64_t n, acc_t<T> limit = std::numeric_limits<acc_t<T>>::infinity());

}  // namespace titan::kernels::ref
