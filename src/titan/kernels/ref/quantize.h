// Reference: block-scaled quantization to FP8 E4M3 and FP4 E2M1 (../shared/reference/v4.md 4.1,
// 4.2, 4.4), scalar and plain, through core/dtype.h's element conversions. Codes are the formats'
// bytes; E2M1 codes are packed two per byte, the low nibble the even column (C must be even).
//
// MX (OCP MX v1.0), blocks of 32 along a row (the last block of a row may be shorter):
//   amax = max |x| over the block
//   scale = 2^e, e = floor(log2 amax) - emax (emax 8 for E4M3, 2 for E2M1) clamped to [-127, 127],
//     stored as the UE8M0 byte e + 127; an all-zero block gets e = -127 (byte 0)
//   code = RNE(x / scale) in the element format, saturated to +-max (448, 6)
//   a block holding a NaN or an infinity gets the NaN scale (byte 0xff) and NaN codes (E4M3 0x7f
//   with x's sign; E2M1, which has no NaN, signed zero): it cannot be represented
// FP8 blockwise (DeepSeek-V3), tiles of br x bc (1 x 128 activations, 128 x 128 weights):
//   amax over the tile; scale = amax / 448 in f32, at least the smallest normal f32 2^-126 (never
//   0 or subnormal, so flushing denormals, as the trainer does, cannot make it 0) (ScaleRule::amax),
//   or the power of two
//   2^ceil(log2(amax / 448)) (ScaleRule::pow2, DeepSeek-V3.1's UE8M0 scales); 1 for an all-zero tile
//   code = RNE_e4m3(fl32(x / scale)) saturated; a tile holding a NaN or an infinity gets a NaN
//   scale and NaN codes, as an MX block does
// Dequantization: x = decode(code) * scale; a NaN scale gives the default quiet NaN (whatever the
// codes' signs), so that every implementation writes the same bits.
// Fake quantization (quantize, then dequantize: the values a GEMM on the codes sees) is that
// composition with every NaN written as the default quiet NaN. MX along columns quantizes blocks of 32 down a
// column: x's transpose quantized along its rows, the values turned back.
#pragma once

#include <cstdint>

namespace titan::kernels::ref {

enum class QuantFormat : uint8_t { e4m3, e2m1 };
enum class ScaleRule : uint8_t { amax, pow2 };

inline constexpr int64_t kMxBlock = 32;

// x [R, C] -> codes [R, C] (E2M1: [R, C / 2] bytes), scales [R, ceil(C / 32)] (UE8M0 bytes).
void mx_quantize(uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols, QuantFormat f);
void mx_dequantize(float* x, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, QuantFormat f);

// x [R, C] -> codes [R, C] (E4M3), scales [ceil(R / br), ceil(C / bc)] f32.
void fp8_block_quantize(uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
                        int64_t bc, ScaleRule rule);
void fp8_block_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t br,
                          int64_t bc);

// FP8 blockwise over row pieces of x [R, C] (FSDP's FP8 all-gather: each rank holds rows
// [row0, row0 + rows) and the tiles are the whole matrix's, so a piece may cut a tile):
//   fp8_block_piece_amax   amax [ceil(R / br), ceil(C / bc)]: each tile's max |x| over the piece's
//                          rows, +inf if one of them is not finite, 0 where the piece has no row
//   fp8_block_scales       scales from `pieces` such grids (one after another): the tile's amax is
//                          their max, and its scale what fp8_block_quantize sets (NaN for +inf)
//   fp8_block_piece_encode the piece's codes under the whole matrix's scales
// Together they give fp8_block_quantize's codes and scales of the whole matrix, bit for bit.
void fp8_block_piece_amax(float* amax, const float* x, int64_t rows, int64_t row0, int64_t total_rows, int64_t cols,
                          int64_t br, int64_t bc);
void fp8_block_scales(float* scales, const float* amax, int64_t pieces, int64_t tiles, ScaleRule rule);
void fp8_block_piece_encode(uint8_t* codes, const float* x, const float* scales, int64_t rows, int64_t row0, int64_t cols,
                            int64_t br, int64_t bc);

// Fake quantization, x [R, C] -> out [R, C] (out may be x). codes and scales, when not null,
// receive what the quantizers above write (MX along rows only).
void mx_fake_quantize(float* out, uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                      QuantFormat f, bool along_rows);
void fp8_block_fake_quantize(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols,
                             int64_t br, int64_t bc, ScaleRule rule);

}  // namespace titan::kernels::ref
