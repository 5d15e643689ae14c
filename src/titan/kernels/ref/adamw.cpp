#include "titan/kernels/ref/adamw.h"

#include <cmath>

namespace titan::kernels::ref {

void adamw_step(float* p, float* m, float* v, bf16* p_bf16, const float* g, int64_t n, const AdamWParams& a) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * a.grad_scale;
    m[i] = a.beta1 * m[i] + (1 - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1 - a.beta2) * gi * gi;
    const float update = (m[i] / a.bias_correction1) / (std::sqrt(v[i] / a.bias_correction2) + a.eps);
    p[i] -= a.lr * (a.weight_decay * p[i] + update);
    if (p_bf16) p_bf16[i] = f32_to_bf16(p[i]);
  }
}

}  // namespace titan::kernels::ref
