// Tensor-level cast between f32 and bf16 (the mixed-precision boundary).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// dst = src converted to dst's dtype; both contiguous, same shape, dtypes f32/bf16 in any pair.
void cast(Tensor& dst, const Tensor& src);

}  // namespace titan::kernels
