// Reference: one AdamW step (decoupled weight decay, Loshchilov & Hutter) over a flat buffer.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"

namespace titan::kernels {

// Step constants shared by the reference and fast kernels.
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;        // multiplies the gradient first (clipping, loss-scale undo)
  float bias_correction1 = 1.0f;  // 1 - beta1^t
  float bias_correction2 = 1.0f;  // 1 - beta2^t
};

namespace ref {

// p, m, v: [n] f32, updated in place; g: [n] f32; p_bf16 (optional): [n] receives bf16(p).
//   g' = g * grad_scale;  m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2
//   p -= lr * (wd * p + (m / bc1) / (sqrt(v / bc2) + eps))
void adamw_step(float* p, float* m, float* v, bf16* p_bf16, const float* g, int64_t n, const AdamWParams& a);

}  // namespace ref
}  // namespace titan::kernels
