// Grouped matmul: the GEMMs of MoE experts over tokens sorted by expert (semantics:
// ref/grouped_matmul.h). Expert e owns rows [offsets[e], offsets[e+1]) of A and multiplies them
// by W[e]^T, so every expert runs as a few large GEMMs instead of one tiny GEMM per token.
//
// Fast path: each segment is cut into row pieces of fixed sizes (full blocks of
// kGroupedRowBlock rows, then the tail as a sum of powers of two), each a oneDNN matmul from
// the primitive cache. Segment sizes change every step, but the piece sizes come from a fixed
// set, so after the first steps no primitive is created. The weight gradient sums the pieces of
// one expert in order into f32: deterministic for any thread count.
#pragma once

#include <cstdint>
#include <span>

#include "titan/core/tensor.h"

namespace titan::kernels {

// Rows per full piece: large enough that oneDNN blocks well, small enough that the tail (at
// most log2 of it in pieces) stays a small share of a typical segment.
inline constexpr int64_t kGroupedRowBlock = 512;

// c [M, N] = per segment a [M, K] @ w[e] [N, K]^T. a, c, w share one dtype (f32 or bf16, f32
// accumulation); offsets has E + 1 non-decreasing entries from 0 to M.
void grouped_matmul_forward(Tensor& c, const Tensor& a, const Tensor& w, std::span<const int64_t> offsets);

// da [M, K] += dc @ w[e] per segment (a's dtype); dw [E, N, K] (f32) += dc_e^T @ a_e. Pass an
// undefined Tensor to skip one (a Tensor is a handle: the const reference still writes data).
void grouped_matmul_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const Tensor& a, const Tensor& w,
                             std::span<const int64_t> offsets);

}  // namespace titan::kernels
