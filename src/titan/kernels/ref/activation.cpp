#include "titan/kernels/ref/activation.h"

#include <cmath>

namespace titan::kernels::ref {

namespace {
// 1 / (1 + e^-x): e^-x overflows to inf for very negative x and the result is then exactly 0.
template <class A>
A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}
}  // namespace

template <class T>
void silu_forward(T* y, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> v = load(x[i]);
    y[i] = store<T>(v * sigmoid(v));
  }
}

template <class T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> v = load(x[i]), s = sigmoid(v);
    dx[i] = store<T>(load(dx[i]) + load(dy[i]) * s * (1 + v * (1 - s)));
  }
}

template <class T>
void swiglu_forward(T* y, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> g = load(gate[i]);
    y[i] = store<T>(g * sigmoid(g) * load(up[i]));
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> g = load(gate[i]), s = sigmoid(g), d = load(dy[i]);
    dgate[i] = store<T>(load(dgate[i]) + d * load(up[i]) * s * (1 + g * (1 - s)));
    dup[i] = store<T>(load(dup[i]) + d * g * s);
  }
}

#define TITAN_INSTANTIATE(T)                                                            \
  template void silu_forward<T>(T*, const T*, int64_t);                                 \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);                      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                     \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
