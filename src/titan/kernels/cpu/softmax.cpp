#include "titan/kernels/cpu/softmax.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Rows per thread chunk: enough that a chunk holds ~32K elements.
TITAN_INLINE int64_t row_grain(int64_t D) { return D >= (1 << 15) ? 1 : (1 << 15) / D; }
}  // namespace

// One row is read from memory once (for its max); the later passes find it in L1/L2 (a row of
// up to ~512 KiB, e.g. a 129K-entry vocabulary in f32, still fits in L2).
template <class T>
void softmax_forward(T* y, const T* x, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* xi = x + i * D;  // [D]
      T* yi = y + i * D;        // [D]
      float m = to_f32(xi[0]);
      // Scalar math: m = max_j x_j
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < D; ++j) {
        const float v = to_f32(xi[j]);
        m = v > m ? v : m;
      }
      float s = 0;
      // Scalar math: s = sum_j exp(x_j - m)
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < D; ++j) s += fast_exp(to_f32(xi[j]) - m);
      const float inv = 1.0f / s;
      // Scalar math: y_j = exp(x_j - m) / s. Recomputing exp costs less than storing it and
      // re-reading, and keeps bf16 outputs singly rounded.
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) yi[j] = from_f32<T>(fast_exp(to_f32(xi[j]) - m) * inv);
    }
  });
}

template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* dyi = dy + i * D;  // [D]
      const T* yi = y + i * D;    // [D]
      T* dxi = dx + i * D;        // [D]
      float dot = 0;
      // Scalar math: dot = sum_j dy_j * y_j
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < D; ++j) dot += to_f32(dyi[j]) * to_f32(yi[j]);
      // Scalar math: dx_j += y_j * (dy_j - dot)   (dy and y now come from L1/L2)
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) dxi[j] = from_f32<T>(to_f32(dxi[j]) + to_f32(yi[j]) * (to_f32(dyi[j]) - dot));
    }
  });
}

#define TITAN_INSTANTIATE(T)                                                   \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void softmax_backward<T>(T*, const T*, const T*, int64_t, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
