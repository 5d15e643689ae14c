// Tensor-level reductions over the last dim and over whole tensors, with the backward of the
// differentiable ones (accumulating, +=). x and dx are [..., D], contiguous, f32 or bf16; a
// per-row result y (or its gradient dy) has N = numel / D elements of x's dtype, any shape.
#pragma once

#include <span>

#include "titan/core/tensor.h"

namespace titan::kernels {

void sum_rows(Tensor& y, const Tensor& x);   // y[i] = sum_j x[i, j]
void mean_rows(Tensor& y, const Tensor& x);  // y[i] = mean_j x[i, j]
// dx[i, j] += scale * dy[i]: backward of sum_rows (scale 1) and mean_rows (scale 1 / D)
void sum_rows_backward(Tensor& dx, const Tensor& dy, double scale);
// y[i] = max_j x[i, j]; argmax (i32, N elements) is its first index, saved for backward
void max_rows(Tensor& y, Tensor& argmax, const Tensor& x);
void max_rows_backward(Tensor& dx, const Tensor& argmax, const Tensor& dy);  // dx[i, argmax[i]] += dy[i]

// Whole-tensor reductions in a fixed order (bit-identical for any thread count), returned as double.
double sum_all(const Tensor& x);
double mean_all(const Tensor& x);
// dx += dy everywhere: backward of sum_all; mean_all's is sum_all_backward(dx, dy / numel)
void sum_all_backward(Tensor& dx, double dy);
// sum over all tensors of sum_i t_i^2 in list order: the squared global L2 norm for gradient clipping
double sum_squares(std::span<const Tensor> tensors);

}  // namespace titan::kernels
