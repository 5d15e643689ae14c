// Reference: one AdamW step (decoupled weight decay, Loshchilov & Hutter) over a flat buffer.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/adamw_params.h"

namespace titan::kernels::ref {

// p, m, v: [n] f32, updated in place; g: [n] f32; p_bf16 (optional): [n] receives bf16(p).
//   g' = g * grad_scale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps))
void adamw_step(float* p, float* m, float* v, bf16* p_bf16, const float* g, int64_t n, const AdamWParams& a);

}  // namespace titan::kernels::ref
