// Tensor-level token embedding: forward gathers table rows, backward scatter-adds into the f32
// table gradient (deterministic: each table row is summed by one thread in token order).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// y [..., D] (f32 or bf16) = table [V, D] (f32) rows at ids [...] (i32). Throws, naming the token,
// if an id is outside [0, V).
void embedding_forward(Tensor& y, const Tensor& table, const Tensor& ids);
// dtable [V, D] (f32) += dy [..., D] rows scattered to ids.
void embedding_backward(Tensor& dtable, const Tensor& dy, const Tensor& ids);

}  // namespace titan::kernels
