// Grouped matmul: the GEMMs of MoE experts over tokens sorted by expert (semantics:
// ref/grouped_matmul.h). Expert e owns rows [offsets[e], offsets[e+1]) of A and multiplies them
// by W[e]^T, so every expert runs as a few large GEMMs instead of one tiny GEMM per token.
//
// Fast path: each segment runs as a few oneDNN matmuls from the primitive cache, with row counts
// from a fixed set, so after the first steps no primitive is created although segment sizes change
// every step: full blocks of kGroupedRowBlock rows, then the rest rounded up to kGroupedRowAlign rows
// in one product (the forward reads and writes the rows past the segment, which later experts
// overwrite), or as an aligned part plus a tail padded to kGroupedRowAlign rows through a small
// scratch (backward, and the forward at the end of the buffer). So the per-call costs (the weight
// repacked for the tile units, a pass over the f32 dw) come one or two times per expert, not once
// per power of two of its tail. The weight gradient sums the pieces of
// one expert in order into f32, on one thread: the same on every run.
//
// With several threads and experts whose rows can be dealt out evenly, each thread runs whole
// experts on one-thread products (MatmulParams::this_thread_only) instead of every product
// running on all threads: oneDNN splits segments of a few hundred rows poorly (at DeepSeek-V3
// debugmodel's [~384, 256] x [256, 256] pieces, 41% of peak on two threads vs 74% of one core's).
#pragma once

#include <cstdint>
#include <span>

#include "titan/core/tensor.h"

namespace titan::kernels {

// Rows per full piece: a typical expert segment (a few thousand tokens x top-k / experts) in one
// or two products; larger blocks only add cached shapes (kGroupedRowBlock / kGroupedRowAlign).
inline constexpr int64_t kGroupedRowBlock = 1024;
// Row granularity of the other pieces: a multiple of the AMX kernels' K block (a weight-gradient
// product sums over rows; other K run on one thread, see onednn/matmul.cpp). 64, not 32: oneDNN
// 2.6 blocks some odd multiples of 32 rows badly (measured: 864, 928 and 992 rows of a bf16
// [rows, 1024] x [1024, 512] product ran at 25-45% of the rate of 960 or 1024 rows).
inline constexpr int64_t kGroupedRowAlign = 64;

// c [M, N] = per segment a [M, K] @ w[e] [N, K]^T. a, c, w share one dtype (f32 or bf16, f32
// accumulation); offsets has E + 1 non-decreasing entries from 0 to M.
void grouped_matmul_forward(Tensor& c, const Tensor& a, const Tensor& w, std::span<const int64_t> offsets);

// da [M, K] += dc @ w[e] per segment (a's dtype); dw [E, N, K] (f32) += dc_e^T @ a_e. With
// accumulate_da / accumulate_dw false the result is written instead (the buffer need not be
// initialized; experts with no rows get zero dw). Pass an undefined Tensor to skip one (a Tensor
// is a handle: the const reference still writes data).
void grouped_matmul_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const Tensor& a, const Tensor& w,
                             std::span<const int64_t> offsets, bool accumulate_dw = true, bool accumulate_da = true);

// Whether the fast path would run these segments one expert per thread (for tests and benchmarks).
bool grouped_matmul_runs_experts_in_parallel(std::span<const int64_t> offsets);

}  // namespace titan::kernels
