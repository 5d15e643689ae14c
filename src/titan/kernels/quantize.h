// Tensor-level block-scaled quantization (ref/quantize.h has the math and the rules for zero,
// NaN and infinite blocks): MXFP8 / MXFP4 (OCP MX v1.0: UE8M0 scales per 32 elements of a row)
// and DeepSeek-V3's FP8 blockwise tiles (f32 scales per br x bc tile). Dispatches to the fast CPU
// kernels (cpu/quantize.h) or, under TITAN_KERNELS=reference, to the reference twin; the two are
// bit-identical.
//
// Tensors: x [R, C] f32 contiguous; codes [R, C] f8e4m3 or f4e2m1 (two codes per byte, the low
// nibble the even column: DeepSeek-V4's FP4 layout); MX scales [R, ceil(C / 32)] e8m0; FP8
// blockwise scales [ceil(R / br), ceil(C / bc)] f32.
#pragma once

#include "titan/core/tensor.h"
#include "titan/kernels/ref/quantize.h"

namespace titan::kernels {

using ref::ScaleRule;

// codes' dtype picks the element format (f8e4m3: MXFP8, f4e2m1: MXFP4; C even for FP4).
void mx_quantize(Tensor& codes, Tensor& scales, const Tensor& x);
void mx_dequantize(Tensor& x, const Tensor& codes, const Tensor& scales);

void fp8_block_quantize(Tensor& codes, Tensor& scales, const Tensor& x, int64_t block_rows, int64_t block_cols,
                        ScaleRule rule = ScaleRule::amax);
void fp8_block_dequantize(Tensor& x, const Tensor& codes, const Tensor& scales, int64_t block_rows, int64_t block_cols);

// FP8 blockwise over row pieces (ref/quantize.h; no fast twin: FSDP's FP8 all-gather runs them once
// per gather on one shard). piece [rows, C] f32 is rows [row0, row0 + rows) of a [total_rows, C]
// matrix (rows past total_rows are padding, read as absent); amax [ceil(total_rows / br), ceil(C / bc)]
// f32; piece_amax [P, ...] the P pieces' grids; codes [rows, C] f8e4m3 (padding rows get zero codes).
void fp8_block_piece_amax(Tensor& amax, const Tensor& piece, int64_t row0, int64_t total_rows, int64_t block_rows,
                          int64_t block_cols);
void fp8_block_scales(Tensor& scales, const Tensor& piece_amax, ScaleRule rule = ScaleRule::amax);
void fp8_block_piece_encode(Tensor& codes, const Tensor& piece, const Tensor& scales, int64_t row0, int64_t total_rows,
                            int64_t block_rows, int64_t block_cols);

// Fake quantization in one pass: out = the dequantized values of x's quantization (every NaN the
// default quiet NaN; ref/quantize.h), what a GEMM on the codes computes with. out [R, C] f32
// contiguous, and may be x itself. With codes and scales, they receive the quantized form too
// (as mx_quantize / fp8_block_quantize write it). MX without codes may run along the columns
// (blocks of 32 down a column, as x's transpose quantized along its rows, with no transpose made);
// FP8 tiles are any br x bc (128 x 1: along the columns).
void mx_fake_quantize(Tensor& out, const Tensor& x, DType element, bool along_rows);
void mx_fake_quantize(Tensor& out, Tensor& codes, Tensor& scales, const Tensor& x);
void fp8_block_fake_quantize(Tensor& out, const Tensor& x, int64_t block_rows, int64_t block_cols,
                             ScaleRule rule = ScaleRule::amax);
void fp8_block_fake_quantize(Tensor& out, Tensor& codes, Tensor& scales, const Tensor& x, int64_t block_rows,
                             int64_t block_cols, ScaleRule rule = ScaleRule::amax);

}  // namespace titan::kernels
