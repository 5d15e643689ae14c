#include "titan/kernels/ref/cast.h"

namespace titan::kernels::ref {

void cast_f32_to_bf16(bf16* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void cast_bf16_to_f32(float* y, const bf16* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(x[i]);
}

void cast_f32_to_f16(f16* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

void cast_f16_to_f32(float* y, const f16* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(x[i]);
}

}  // namespace titan::kernels::ref
