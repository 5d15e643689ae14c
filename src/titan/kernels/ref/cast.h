// Reference: element-wise cast between f32 and bf16 / f16 (round to nearest even; f16 overflows
// to infinity, which the loss scaler must see).
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"

namespace titan::kernels::ref {

// y[n] = cast(x[n])
void cast_f32_to_bf16(bf16* y, const float* x, int64_t n);
void cast_bf16_to_f32(float* y, const bf16* x, int64_t n);
void cast_f32_to_f16(f16* y, const float* x, int64_t n);
void cast_f16_to_f32(float* y, const f16* x, int64_t n);

}  // namespace titan::kernels::ref
