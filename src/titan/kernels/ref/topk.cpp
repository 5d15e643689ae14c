#include "titan/kernels/ref/topk.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace titan::kernels::ref {

template <class T>
void topk(T* values, int32_t* indices, const T* x, int64_t rows, int64_t n, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n;
    std::iota(order.begin(), order.end(), 0);
    // Stable: equal values (and NaNs among themselves) keep ascending index order.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const acc_t<T> va = load(row[a]), vb = load(row[b]);
      if (std::isnan(va)) return !std::isnan(vb);
      if (std::isnan(vb)) return false;
      return va > vb;
    });
    for (int64_t j = 0; j < k; ++j) {
      indices[r * k + j] = order[size_t(j)];
      values[r * k + j] = row[order[size_t(j)]];
    }
  }
}

template void topk<float>(float*, int32_t*, const float*, int64_t, int64_t, int64_t);
template void topk<bf16>(bf16*, int32_t*, const bf16*, int64_t, int64_t, int64_t);
template void topk<double>(double*, int32_t*, const double*, int64_t, int64_t, int64_t);

}  // namespace titan::kernels::ref
