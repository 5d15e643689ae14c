// Reference: reductions over the last dim (sum, mean, max) and over a whole buffer (sum, sum of
// squares), with the backward of the differentiable ones (accumulating, +=).
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y[i] = sum_j x[i, j]
template <class T>
void sum_rows(T* y,        // [N]
              const T* x,  // [N, D]
              int64_t N, int64_t D);
// y[i] = sum_j x[i, j] / D
template <class T>
void mean_rows(T* y,        // [N]
               const T* x,  // [N, D]
               int64_t N, int64_t D);
// dx[i, j] += scale * dy[i]: backward of sum_rows (scale 1), mean_rows (1 / D), and, with N = 1,
// dy = {1} and scale = the scalar gradient, of sum_all and mean_all
template <class T>
void sum_rows_backward(T* dx,        // [N, D]
                       const T* dy,  // [N]
                       acc_t<T> scale, int64_t N, int64_t D);
// y[i] = max_j x[i, j], argmax[i] = its first index (a row holding NaN gives an unspecified max)
template <class T>
void max_rows(T* y,             // [N]
              int32_t* argmax,  // [N] saved for backward
              const T* x,       // [N, D]
              int64_t N, int64_t D);
// dx[i, argmax[i]] += dy[i]
template <class T>
void max_rows_backward(T* dx,                 // [N, D]
                       const int32_t* argmax,  // [N]
                       const T* dy,           // [N]
                       int64_t N, int64_t D);

// Whole-buffer reductions return double: they feed scalars (loss, gradient norm) whose later
// arithmetic should not lose the digits an f32 total over millions of elements would. The
// references accumulate in double throughout.
template <class T>
double sum_all(const T* x,  // [n]
               int64_t n);
// sum_i x_i^2: one buffer's share of a global squared L2 norm (gradient clipping)
template <class T>
double sum_squares(const T* x,  // [n]
                   int64_t n);

}  // namespace titan::kernels::ref
