// Fast block-scaled quantization to FP8 E4M3 and FP4 E2M1 (per-ISA variants; see cpu/isa.h).
// Semantics, shapes and code layout as in ref/quantize.h; bit-identical to it.
#pragma once

#include <cstdint>

#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/quantize.h"

#define TITAN_QUANTIZE_KERNELS                                                                                  \
  void mx_quantize(uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,                 \
                   ::titan::kernels::ref::QuantFormat f);                                                        \
  void mx_dequantize(float* x, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,          \
                     ::titan::kernels::ref::QuantFormat f);                                                      \
  void fp8_block_quantize(uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br, \
                          int64_t bc, ::titan::kernels::ref::ScaleRule rule);                                    \
  void fp8_block_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t rows, int64_t cols,      \
                            int64_t br, int64_t bc);                                                   \
  void mx_fake_quantize(float* out, uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,  \
                        ::titan::kernels::ref::QuantFormat f, bool along_rows);                                  \
  void fp8_block_fake_quantize(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows,          \
                               int64_t cols, int64_t br, int64_t bc, ::titan::kernels::ref::ScaleRule rule);
TITAN_FOR_EACH_ISA(TITAN_QUANTIZE_KERNELS)
