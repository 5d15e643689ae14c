// Reference: top-k along the last dim. Not differentiable (a gather of the selected entries gives
// gradients).
//
// Order: values rank by size with NaN above +inf (as torch.topk, so a NaN score is selected and
// visible rather than silently dropped) and -0 equal to +0; -inf ranks lowest, so masked entries
// fill the tail only when fewer than k entries are finite. Equal values rank lower index first.
// Output row r holds the k highest-ranked entries in rank order (descending), with their indices.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

template <class T>
void topk(T* values,          // [N, K]
          int32_t* indices,   // [N, K]
          const T* x,         // [N, n]
          int64_t rows, int64_t n, int64_t k);  // 1 <= k <= n

}  // namespace titan::kernels::ref
