// Reference: row gather with optional per-row weights, and its transpose, scatter-add. MoE uses
// them to permute tokens to experts (gather) and to combine expert outputs weighted by the
// router (scatter-add), so both differentiate with respect to the weights too.
//
// A null w means every weight is 1 (and no weight gradient is wanted: pass dw = nullptr).
// Scatter-add sums the contributions to one destination row in f32 in ascending i, then adds
// them to the destination with one rounding to T; the fast kernels do the same.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y[i] = w[i] * x[idx[i]], i in [0, M)
template <class T>
void gather_rows_forward(T* y,                // [M, D]
                         const T* x,          // [R, D]
                         const int32_t* idx,  // [M], each in [0, R)
                         const acc_t<T>* w,   // [M] or nullptr
                         int64_t m, int64_t d);

// dx[idx[i]] += w[i] * dy[i] (skipped when dx is null); dw[i] += dot(dy[i], x[idx[i]]) (skipped
// when dw is null)
template <class T>
void gather_rows_backward(T* dx,              // [R, D]
                          acc_t<T>* dw,       // [M] or nullptr
                          const T* dy,        // [M, D]
                          const T* x,         // [R, D]
                          const int32_t* idx, // [M]
                          const acc_t<T>* w,  // [M] or nullptr
                          int64_t r, int64_t m, int64_t d);

// y[idx[i]] += w[i] * x[i], i in [0, M)
template <class T>
void scatter_add_rows_forward(T* y,                // [R, D]
                              const T* x,          // [M, D]
                              const int32_t* idx,  // [M], each in [0, R)
                              const acc_t<T>* w,   // [M] or nullptr
                              int64_t r, int64_t m, int64_t d);

// dx[i] += w[i] * dy[idx[i]] (skipped when dx is null); dw[i] += dot(dy[idx[i]], x[i]) (skipped
// when dw is null)
template <class T>
void scatter_add_rows_backward(T* dx,               // [M, D]
                               acc_t<T>* dw,        // [M] or nullptr
                               const T* dy,         // [R, D]
                               const T* x,          // [M, D]
                               const int32_t* idx,  // [M]
                               const acc_t<T>* w,   // [M] or nullptr
                               int64_t m, int64_t d);

}  // namespace titan::kernels::ref
