// Fast DeepSeek-V4 compressor pooling, forward and backward (per-ISA variants; see cpu/isa.h).
// Semantics and shapes as in ref/compressor.h; f32.
#pragma once

#include <cstdint>

#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/compressor.h"

#define TITAN_COMPRESSOR_KERNELS                                                                                \
  void compressor_forward(float* out, const float* kv, const float* gate, const float* bias, int64_t B, int64_t S, \
                          int64_t D, int64_t m, ::titan::kernels::ref::CompressorKind kind);                     \
  void compressor_backward(float* dkv, float* dgate, float* dbias, const float* dout, const float* kv,            \
                           const float* gate, const float* bias, int64_t B, int64_t S, int64_t D, int64_t m,      \
                           ::titan::kernels::ref::CompressorKind kind);
TITAN_FOR_EACH_ISA(TITAN_COMPRESSOR_KERNELS)
