// Tensor-level cast between f32 and bf16 / f16 (the mixed-precision boundary).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// dst = src converted to dst's dtype; both contiguous, same shape, f32 to or from bf16 or f16
// (or one dtype to itself).
void cast(Tensor& dst, const Tensor& src);

}  // namespace titan::kernels
