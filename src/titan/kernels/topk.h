// Tensor-level top-k along the last dim (semantics and ordering rules: ref/topk.h). Used by MoE
// routing (k = 8 of 256 experts) and DSA key selection (k = 2048 of up to 128K keys).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// values [..., k] (x's dtype, f32 or bf16) and indices [..., k] (i32) of the k highest-ranked
// entries of each row of x [..., n], in descending rank; 1 <= k <= n.
void topk(Tensor& values, Tensor& indices, const Tensor& x, int64_t k);

}  // namespace titan::kernels
