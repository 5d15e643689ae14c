// A linear layer trained under a low-precision recipe (docs/precision.md; the formats:
// kernels/quantize.h, ../shared/reference/v4.md 4.1 and 4.2). For y = x w^T, x [N, K], w [M, K],
// each of the three GEMMs takes its inputs quantized along its own reduction dimension:
//   forward  y  = Q(x along K) Q(w along K)^T
//   dgrad    dx = Q(dy along M) Q(w along M)
//   wgrad    dw = Q(dy along N)^T Q(x along N)
// FP8 blockwise (DeepSeek-V3): x and dy in E4M3 tiles of 1 x 128 along the reduction (128 x 1 across
// tokens for wgrad), w in 128 x 128 blocks (the same blocks both ways), f32 scales amax / 448.
// MXFP8 / MXFP4 (OCP MX v1.0): blocks of 32 along the reduction with UE8M0 scales; x and dy in
// E4M3, w in E4M3 or E2M1.
// The quantizers pass gradients straight through: dx and dw are the quantized GEMMs' results, and
// the f32 master weight takes the update.
//
// This CPU has no FP8 or FP4 GEMM: the quantized operands are dequantized to f32 for the f32 GEMM,
// which accumulates in f32. The numerics are the recipe's; the time is f32's plus the quantizers'.
// What backward keeps of x is its forward codes and scales (1 byte per value instead of 4); wgrad
// re-quantizes their values across tokens.
#pragma once

#include <cstdint>

#include "titan/autograd/variable.h"

namespace titan::autograd {

enum class LowPrecision : uint8_t { fp8_blockwise, mxfp8, mxfp4 };

// x [..., K] f32, w [M, K] f32 -> [..., M] f32.
Variable quantized_linear(const Variable& x, const Variable& w, LowPrecision recipe);

// The value of t [R, C] f32 after quantizing it as `recipe` quantizes operand `role` along its rows
// (the reduction along C) or its columns (along R), then dequantizing: what the GEMMs above see.
enum class QuantRole : uint8_t { activation, weight };
Tensor fake_quantize(const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows);

}  // namespace titan::autograd
