// The constants of one fused AdamW step, shared by the reference and fast kernels and by
// optim::AdamW, which holds the base values (lr, betas, eps, weight_decay; the defaults are
// [optimizer]'s in train/config.h) and fills in the per-step ones on every call.
#pragma once

namespace titan::kernels {

struct AdamWParams {
  float lr = 8e-4f;  // optim::AdamW::step replaces it by the schedule's value for the step
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;  // optim::AdamW passes 0 for parameters outside the decay group
  // Per step:
  float grad_scale = 1.0f;        // multiplies the gradient first (clipping, loss-scale undo)
  float bias_correction1 = 1.0f;  // 1 - beta1^t
  float bias_correction2 = 1.0f;  // 1 - beta2^t
};

}  // namespace titan::kernels
