// Tensor-level row gather and scatter-add with optional per-row weights (semantics: ref/gather.h).
// x/y/dx/dy are contiguous 2-D [rows, D] in f32 or bf16 (one dtype throughout); idx is i32 [M];
// w is f32 [M] or undefined (all weights 1). Gradient outputs are accumulated into; leave one
// undefined to skip it (dw needs w).
// Scatter-adds are deterministic: each destination row sums its sources in ascending order on
// one thread (kernels/row_buckets.h).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// y [M, D] = w[i] * x[idx[i]], x [R, D]
void gather_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w = {});
// dx [R, D] += scatter of w[i] * dy[i] to rows idx[i]; dw [M] += dot(dy[i], x[idx[i]])
void gather_rows_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                          const Tensor& w = {});
// y [R, D] += w[i] * x[i] at rows idx[i], x [M, D]
void scatter_add_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w = {});
// dx [M, D] += w[i] * dy[idx[i]]; dw [M] += dot(dy[idx[i]], x[i]); dy [R, D]
void scatter_add_rows_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                               const Tensor& w = {});

// Throws unless idx is contiguous i32 with every entry in [0, rows); the error names the first
// bad entry, e.g. "embedding_forward: token id 130000 at position 17 is outside the vocabulary
// [0, 129280)" for op "embedding_forward", what "token id", range "the vocabulary".
void check_row_indices(const Tensor& idx, int64_t rows, const char* op, const char* what, const char* hint,
                       const char* range = "");

}  // namespace titan::kernels
