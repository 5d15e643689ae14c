// Tensor-level DeepSeek-V4 compressor pooling (kernels/ref/compressor.h has the math): kv and
// gate [B, S, C] f32 contiguous, position bias [m, C] -> entries [B, S / m, D], C = D for HCA and
// 2D for CSA (whose entries also pool the previous window's first halves). Backward accumulates
// (+=) into dkv, dgate and dbias, recomputing the slot weights (only the inputs are saved).
#pragma once

#include "titan/core/tensor.h"
#include "titan/kernels/ref/compressor.h"

namespace titan::kernels {

using ref::CompressorKind;

void compressor_forward(Tensor& out, const Tensor& kv, const Tensor& gate, const Tensor& bias, int64_t m,
                        CompressorKind kind);
void compressor_backward(Tensor& dkv, Tensor& dgate, Tensor& dbias, const Tensor& dout, const Tensor& kv,
                         const Tensor& gate, const Tensor& bias, int64_t m, CompressorKind kind);

}  // namespace titan::kernels
