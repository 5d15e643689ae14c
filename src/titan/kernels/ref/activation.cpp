#include "titan/kernels/ref/activation.h"

#include <algorithm>
#include <cmath>

namespace titan::kernels::ref {

namespace {
// 1 / (1 + e^-x): e^-x overflows to inf for very negative x and the result is then exactly 0.
template <class A>
A sigmoid(A x) {
  return A(1) / (A(1) + std::exp(-x));
}

// The clamps keep a NaN input NaN (std::min / std::max return their first argument when the
// comparison is false), and an infinite limit leaves every value as it is. "Not beyond" rather
// than "within" lets a NaN's gradient through, as the unclamped SwiGLU does.
template <class A>
A clamp_gate(A g, A limit) {
  return std::min(g, limit);
}
template <class A>
A clamp_up(A u, A limit) {
  return std::max(std::min(u, limit), -limit);
}
template <class A>
bool gate_passes(A g, A limit) {
  return !(g > limit);
}
template <class A>
bool up_passes(A u, A limit) {
  return !(u > limit || u < -limit);
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
void swiglu_forward(T* y, const T* gate, const T* up, int64_t n, acc_t<T> limit) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> g = clamp_gate(load(gate[i]), limit);
    y[i] = store<T>(g * sigmoid(g) * clamp_up(load(up[i]), limit));
  }
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n, acc_t<T> limit) {
  using A = acc_t<T>;
  for (int64_t i = 0; i < n; ++i) {
    const A g_in = load(gate[i]), u_in = load(up[i]);
    const A g = clamp_gate(g_in, limit), u = clamp_up(u_in, limit), s = sigmoid(g), d = load(dy[i]);
    const A dg = gate_passes(g_in, limit) ? d * u * s * (1 + g * (1 - s)) : A(0);
    const A du = up_passes(u_in, limit) ? d * g * s : A(0);
    dgate[i] = store<T>(load(dgate[i]) + dg);
    dup[i] = store<T>(load(dup[i]) + du);
  }
}

#define TITAN_INSTANTIATE(T)                                                            \
  template void silu_forward<T>(T*, const T*, int64_t);                                 \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);                      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, acc_t<T>);           \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, acc_t<T>);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
