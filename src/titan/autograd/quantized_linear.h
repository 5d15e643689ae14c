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
// Each operand is quantized and dequantized in one pass (kernels::*_fake_quantize, along the
// columns without a transpose) into per-thread buffers kept from call to call. What backward keeps
// of x is its forward codes and scales (1 byte per value instead of 4); wgrad re-quantizes their
// values across tokens.
#pragma once

#include <cstdint>

#include "titan/autograd/variable.h"

namespace titan::autograd {

enum class LowPrecision : uint8_t { fp8_blockwise, mxfp8, mxfp4 };

// x [..., K] f32, w [M, K] f32 -> [..., M] f32.
Variable quantized_linear(const Variable& x, const Variable& w, LowPrecision recipe);

// A weight's quantized forms, recomputed only when the parameters changed (parameters_epoch()
// moved: the trainer moves it once per step, after the optimizer's update, and a checkpoint load
// or re-initialization moves it too), into buffers kept from step to step: no allocation in a
// steady state. codes / scales are the real FP8 / FP4 storage of the forward operand (along K);
// along_k / along_m are the f32 values of w quantized along K and along M, which the emulated GEMMs
// read (FP8 blockwise's square blocks give one tensor for both; MX's along-M codes, which an MX
// GEMM would store too, are not kept: nothing here reads them).
class QuantizedWeight {
 public:
  // w [M, K]: the f32 master (or its gathered copy under FSDP), or the bf16 compute copy.
  void refresh(const Tensor& w, LowPrecision recipe);
  // FP8 blockwise forms made elsewhere: FSDP's FP8 all-gather hands over the gathered codes [M, K]
  // and the whole weight's block scales, which are what refresh would compute from the weight, so
  // nothing is quantized again. Until the parameters change refresh keeps them (and, having no
  // weight to quantize, refuses to run once they changed without new forms).
  void adopt_fp8_blockwise(const Tensor& codes, const Tensor& scales);
  Tensor codes, scales, along_k, along_m;
  int64_t stored_bytes() const;  // codes and scales
 private:
  uint64_t epoch_ = ~uint64_t(0);
  bool adopted_ = false;  // the forms came from adopt_fp8_blockwise
  Tensor widened_;  // the f32 values of a bf16 w
};

// The parameters' version: a counter moved whenever any parameter's value may have changed.
uint64_t parameters_epoch();
void note_parameters_changed();

// quantized_linear with the weight's forms from `cache` (refreshed as needed): x [..., K] any float
// dtype (cast to f32 and back), w's value f32 [M, K]. The gradient reaches w as the f32 dw.
Variable quantized_linear(const Variable& x, const Variable& w, const Tensor& w_value, LowPrecision recipe,
                          QuantizedWeight& cache);

// The value of t [R, C] f32 after quantizing it as `recipe` quantizes operand `role` along its rows
// (the reduction along C) or its columns (along R), then dequantizing: what the GEMMs above see.
enum class QuantRole : uint8_t { activation, weight };
Tensor fake_quantize(const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows);

// An operand quantized along its rows (the reduction along its columns): the real codes and
// scales, which backward keeps (1 byte a value), and how to read them back as f32.
struct QuantizedRows {
  Tensor codes, scales;
  LowPrecision recipe = LowPrecision::fp8_blockwise;
  int64_t tile_rows = 0, tile_cols = 0;  // FP8 blockwise
  Tensor dequantize() const;
  void dequantize(Tensor& out) const;  // into out [R, C] f32
};
// t [R, C] f32 contiguous: an activation in 1 x 128 FP8 tiles or 1 x 32 MX blocks (E4M3), a
// weight in 128 x 128 FP8 blocks or 1 x 32 MX blocks (E4M3, or E2M1 under mxfp4).
QuantizedRows quantize_rows(const Tensor& t, LowPrecision recipe, QuantRole role);

}  // namespace titan::autograd
