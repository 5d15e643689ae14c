#include "titan/kernels/cpu/activation.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Elements per thread chunk. The exp makes each element ~20 flops, so chunks can be smaller than
// a pure copy's before threading pays.
constexpr int64_t kGrain = 1 << 13;

// fast_exp(-x) overflows to inf for x < -88.7, and 1 / inf = 0, the limit.
TITAN_INLINE float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }
}  // namespace

template <class T>
void silu_forward(T* y, const T* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = x * sigmoid(x)
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float v = to_f32(x[i]);
      y[i] = from_f32<T>(v * sigmoid(v));
    }
  });
}

template <class T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: dx += dy * s * (1 + x * (1 - s)), s = sigmoid(x)
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float v = to_f32(x[i]), s = sigmoid(v);
      dx[i] = from_f32<T>(to_f32(dx[i]) + to_f32(dy[i]) * s * (1.0f + v * (1.0f - s)));
    }
  });
}

template <class T>
void swiglu_forward(T* y, const T* gate, const T* up, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = gate * sigmoid(gate) * up
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float g = to_f32(gate[i]);
      y[i] = from_f32<T>(g * sigmoid(g) * to_f32(up[i]));
    }
  });
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: dgate += dy * up * s * (1 + g * (1 - s)); dup += dy * g * s; s = sigmoid(g)
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) {
      const float g = to_f32(gate[i]), s = sigmoid(g), d = to_f32(dy[i]);
      dgate[i] = from_f32<T>(to_f32(dgate[i]) + d * to_f32(up[i]) * s * (1.0f + g * (1.0f - s)));
      dup[i] = from_f32<T>(to_f32(dup[i]) + d * g * s);
    }
  });
}

#define TITAN_INSTANTIATE(T)                                                            \
  template void silu_forward<T>(T*, const T*, int64_t);                                 \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);                      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t);                     \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
