// Tensor-level fused AdamW step.
#pragma once

#include "titan/core/tensor.h"
#include "titan/kernels/adamw_params.h"

namespace titan::kernels {

// param, exp_avg, exp_avg_sq: f32, updated in place; grad: f32; param_bf16: optional bf16 copy
// of the updated parameter (the mixed-precision compute weights), written in the same pass.
void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor* param_bf16, const Tensor& grad,
                const AdamWParams& a);
// The same over n contiguous elements given by pointer (a chunk of swapped optimizer state).
void adamw_step(float* param, float* exp_avg, float* exp_avg_sq, bf16* param_bf16, const float* grad, int64_t n,
                const AdamWParams& a);

}  // namespace titan::kernels
