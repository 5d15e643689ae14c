#include "titan/kernels/ref/cross_entropy.h"

#include <cmath>
#include <limits>

namespace titan::kernels::ref {

template <class T>
void cross_entropy_forward(acc_t<T>* loss, acc_t<T>* lse, const T* logits, const int32_t* targets, int64_t n,
                           int64_t v, int32_t ignore_index) {
  using A = acc_t<T>;
  for (int64_t r = 0; r < n; ++r) {
    if (targets[r] == ignore_index) {
      loss[r] = 0;
      lse[r] = 0;
      continue;
    }
    const T* row = logits + r * v;
    A m = -std::numeric_limits<A>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, load(row[j]));
    A s = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(load(row[j]) - m);
    lse[r] = m + std::log(s);
    loss[r] = lse[r] - load(row[targets[r]]);
  }
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const acc_t<T>* lse,
                            const acc_t<T>* dloss, acc_t<T> scale, int64_t n, int64_t v, int32_t ignore_index) {
  using A = acc_t<T>;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = targets[r];
    const A g = t == ignore_index ? A(0) : scale * (dloss ? dloss[r] : A(1));
    for (int64_t j = 0; j < v; ++j) {
      const A p = t == ignore_index ? A(0) : std::exp(load(logits[r * v + j]) - lse[r]);
      dlogits[r * v + j] = store<T>((p - (j == t ? A(1) : A(0))) * g);
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                        \
  template void cross_entropy_forward<T>(acc_t<T>*, acc_t<T>*, const T*, const int32_t*, int64_t, int64_t, int32_t); \
  template void cross_entropy_backward<T>(T*, const T*, const int32_t*, const acc_t<T>*, const acc_t<T>*, acc_t<T>,  \
                                          int64_t, int64_t, int32_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
