// Reference: SiLU and the fused SwiGLU gate of Llama/DeepSeek feed-forward blocks, forward and
// backward. silu(x) = x * sigmoid(x). Backward accumulates (+=) into gradients.
#pragma once

#include <cstdint>

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
// y = silu(gate) * up, the two halves of the feed-forward's first projection (n = N * F)
template <class T>
void swiglu_forward(T* y,           // [N, F]
                    const T* gate,  // [N, F]
                    const T* up,    // [N, F]
                    int64_t n);
// dgate += dy * up * silu'(gate); dup += dy * silu(gate)
template <class T>
void swiglu_backward(T* dgate,       // [N, F]
                     T* dup,         // [N, F]
                     const T* dy,    // [N, F]
                     const T* gate,  // [N, F]
                     const T* up,    // [N, F]
                     int64_t n);

}  // namespace titan::kernels::ref
