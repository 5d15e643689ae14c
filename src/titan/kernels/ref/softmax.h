// Reference: softmax over the last dim, forward and backward. Numerically stable: each row's
// max is subtracted before exp, so no exp overflows.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y[i, :] = exp(x[i, :] - max_j x[i, j]) / sum_j exp(x[i, j] - max)
template <class T>
void softmax_forward(T* y,        // [N, D]
                     const T* x,  // [N, D]
                     int64_t N, int64_t D);
// dx[i, :] += y[i, :] * (dy[i, :] - sum_j dy[i, j] y[i, j]); needs only the forward's output
template <class T>
void softmax_backward(T* dx,        // [N, D]
                      const T* dy,  // [N, D]
                      const T* y,   // [N, D]
                      int64_t N, int64_t D);

}  // namespace titan::kernels::ref
