#include "titan/kernels/ref/softmax.h"

#include <cmath>

namespace titan::kernels::ref {

template <class T>
void softmax_forward(T* y, const T* x, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * D;  // [D]
    T* yi = y + i * D;        // [D]
    acc_t<T> m = load(xi[0]);
    for (int64_t j = 1; j < D; ++j) m = std::fmax(m, load(xi[j]));
    acc_t<T> s = 0;
    for (int64_t j = 0; j < D; ++j) s += std::exp(load(xi[j]) - m);
    const acc_t<T> inv = 1 / s;
    for (int64_t j = 0; j < D; ++j) yi[j] = store<T>(std::exp(load(xi[j]) - m) * inv);
  }
}

template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    const T* dyi = dy + i * D;  // [D]
    const T* yi = y + i * D;    // [D]
    T* dxi = dx + i * D;        // [D]
    acc_t<T> dot = 0;
    for (int64_t j = 0; j < D; ++j) dot += load(dyi[j]) * load(yi[j]);
    for (int64_t j = 0; j < D; ++j) dxi[j] = store<T>(load(dxi[j]) + load(yi[j]) * (load(dyi[j]) - dot));
  }
}

#define TITAN_INSTANTIATE(T)                                                   \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void softmax_backward<T>(T*, const T*, const T*, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
