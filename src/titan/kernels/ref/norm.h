// Reference: RMSNorm and LayerNorm over the last dim, forward and backward. Weights, biases,
// saved statistics and their gradients are acc_t<T>; backward accumulates (+=) into dx, dw, db.
// A null dw (or db) means that parameter needs no gradient.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y = x * rstd * w, rstd = 1 / sqrt(mean_j x_j^2 + eps)
template <class T>
void rmsnorm_forward(T* y,                // [N, D]
                     acc_t<T>* rstd,      // [N] saved for backward
                     const T* x,          // [N, D]
                     const acc_t<T>* w,   // [D]
                     int64_t N, int64_t D, acc_t<T> eps);
// dx += rstd * w * dy - x * rstd^3 / D * sum_j(dy_j w_j x_j); dw += sum_rows(dy * x * rstd)
template <class T>
void rmsnorm_backward(T* dx,                 // [N, D]
                      acc_t<T>* dw,          // [D] or null
                      const acc_t<T>* rstd,  // [N]
                      const T* dy,           // [N, D]
                      const T* x,            // [N, D]
                      const acc_t<T>* w,     // [D]
                      int64_t N, int64_t D);

// y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + eps) with the biased variance
template <class T>
void layernorm_forward(T* y,               // [N, D]
                       acc_t<T>* mean,     // [N] saved for backward
                       acc_t<T>* rstd,     // [N] saved for backward
                       const T* x,         // [N, D]
                       const acc_t<T>* w,  // [D]
                       const acc_t<T>* b,  // [D]
                       int64_t N, int64_t D, acc_t<T> eps);
// With xhat = (x - mean) rstd and g = dy w:
// dx += rstd (g - mean_j g_j - xhat mean_j(g_j xhat_j)); dw += sum_rows(dy xhat); db += sum_rows(dy)
template <class T>
void layernorm_backward(T* dx,                 // [N, D]
                        acc_t<T>* dw,          // [D] or null
                        acc_t<T>* db,          // [D] or null
                        const acc_t<T>* mean,  // [N]
                        const acc_t<T>* rstd,  // [N]
                        const T* dy,           // [N, D]
                        const T* x,            // [N, D]
                        const acc_t<T>* w,     // [D]
                        int64_t N, int64_t D);

}  // namespace titan::kernels::ref
