#include "titan/kernels/cpu/adamw.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

void adamw_step(float* p, float* m, float* v, bf16* p_bf16, const float* g, int64_t n, const AdamWParams& a) {
  const float b1 = a.beta1, b2 = a.beta2, ib1 = 1 - a.beta1, ib2 = 1 - a.beta2;
  const float inv_bc1 = 1.0f / a.bias_correction1, inv_bc2 = 1.0f / a.bias_correction2;
  const float lr = a.lr, wd = a.weight_decay, scale = a.grad_scale, eps = a.eps;
  // One pass over p, m, v, g (and p_bf16): the step is memory-bound, so everything is fused.
  // The constants are copied into the chunk's body: read through the closure, the compiler must
  // assume the stores to m, v and p may change them, and the loop does not vectorize.
  parallel_for(0, n, 1 << 14, [=](int64_t lo, int64_t hi) {
    // Scalar math: the reference's, with divisions by the bias corrections as multiplications.
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = g[i] * scale;
      const float mi = b1 * m[i] + ib1 * gi;
      const float vi = b2 * v[i] + ib2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      p[i] -= lr * (wd * p[i] + (mi * inv_bc1) / (__builtin_sqrtf(vi * inv_bc2) + eps));
    }
    if (p_bf16) {
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) p_bf16[i] = f32_to_bf16(p[i]);
    }
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
