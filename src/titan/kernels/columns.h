// Copies and sums of column blocks between row-major activations: the data movement of
// splitting one projection's output into parts and of concatenating parts along the last dim
// (MLA's latent | rope-key split, its nope | value split, and its key = [nope | shared rope part]).
// Tensors are contiguous, f32 or bf16, and viewed as [rows, width] with width = the last dim.
// Plain loops over rows: the work is a memcpy per row, so there is nothing for SIMD to win over
// the compiler's own memcpy and add loops, and no separate reference twin.
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// dst[r, dst_col + j] = src[r / repeat, src_col + j] for j < width and every row r of dst.
// repeat > 1 broadcasts each src row to `repeat` consecutive dst rows (src has rows / repeat
// rows), e.g. one shared rope key [N, 1, Dr] into every head of [N, H, Dqk]. Converts dtype.
void copy_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t width,
                  int64_t repeat = 1);

// dst[r, dst_col + j] += sum_{i < repeat} src[r * repeat + i, src_col + j]: the backward of
// copy_columns (dst has the rows of copy_columns' src). dst and src share a dtype; the sum runs
// in f32 in ascending i, so the result does not depend on the thread count.
void add_columns(Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t width,
                 int64_t repeat = 1);

}  // namespace titan::kernels
