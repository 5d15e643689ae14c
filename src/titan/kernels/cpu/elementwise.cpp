#include "titan/kernels/cpu/elementwise.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

// Each kernel hands contiguous spans to a force-inlined span function: with the pointers as plain
// parameters (not captured by a lambda) GCC vectorizes the loops.
namespace titan::kernels::cpu::TITAN_ISA {

namespace {
constexpr int64_t kGrain = 1 << 15;  // elements per thread chunk: below this, threads cost more than they save

template <class T>
TITAN_INLINE void add_span(T* y, const T* a, const T* b, float alpha, int64_t n) {
  // Scalar math: y = a + alpha * b
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(to_f32(a[i]) + alpha * to_f32(b[i]));
}

template <class T>
TITAN_INLINE void add_backward_span(T* da, T* db, const T* dy, float alpha, int64_t n) {
  // Scalar math: da += dy; db += alpha * dy (dy read once for both)
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(dy[i]);
    da[i] = from_f32<T>(to_f32(da[i]) + g);
    db[i] = from_f32<T>(to_f32(db[i]) + alpha * g);
  }
}

template <class T>
TITAN_INLINE void mul_span(T* y, const T* a, const T* b, int64_t n) {
  // Scalar math: y = a * b
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(to_f32(a[i]) * to_f32(b[i]));
}

template <class T>
TITAN_INLINE void mul_backward_span(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n) {
  // Scalar math: da += dy * b; db += dy * a
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = to_f32(dy[i]), av = to_f32(a[i]), bv = to_f32(b[i]);
    da[i] = from_f32<T>(to_f32(da[i]) + g * bv);
    db[i] = from_f32<T>(to_f32(db[i]) + g * av);
  }
}

template <class T>
TITAN_INLINE void scale_span(T* y, const T* x, float alpha, int64_t n) {
  // Scalar math: y = alpha * x
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(alpha * to_f32(x[i]));
}

template <class T>
TITAN_INLINE void axpby_span(T* y, const T* x, float alpha, float beta, int64_t n) {
  // Scalar math: y = alpha * x + beta * y
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = from_f32<T>(alpha * to_f32(x[i]) + beta * to_f32(y[i]));
}
}  // namespace

template <class T>
void add(T* y, const T* a, const T* b, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { add_span(y + lo, a + lo, b + lo, alpha, hi - lo); });
}

// With one gradient missing, the other is the accumulate step axpby(g, dy, c, 1).
template <class T>
void add_backward(T* da, T* db, const T* dy, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (da && db) {
      add_backward_span(da + lo, db + lo, dy + lo, alpha, hi - lo);
    } else if (da) {
      axpby_span(da + lo, dy + lo, 1.0f, 1.0f, hi - lo);
    } else if (db) {
      axpby_span(db + lo, dy + lo, alpha, 1.0f, hi - lo);
    }
  });
}

template <class T>
void mul(T* y, const T* a, const T* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { mul_span(y + lo, a + lo, b + lo, hi - lo); });
}

// With one gradient missing, the other is g += dy * (the other input): mul_backward_span with
// that gradient in both output slots would double-count, so it gets its own loop.
template <class T>
void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (da && db) {
      mul_backward_span(da + lo, db + lo, dy + lo, a + lo, b + lo, hi - lo);
    } else if (da || db) {
      T* g = (da ? da : db) + lo;
      const T* other = (da ? b : a) + lo;
      const T* d = dy + lo;
      // Scalar math: g += dy * other
#pragma omp simd
      for (int64_t i = 0; i < hi - lo; ++i) g[i] = from_f32<T>(to_f32(g[i]) + to_f32(d[i]) * to_f32(other[i]));
    }
  });
}

template <class T>
void scale(T* y, const T* x, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { scale_span(y + lo, x + lo, alpha, hi - lo); });
}

template <class T>
void axpby(T* y, const T* x, float alpha, float beta, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { axpby_span(y + lo, x + lo, alpha, beta, hi - lo); });
}

#define TITAN_INSTANTIATE(T)                                                       \
  template void add<T>(T*, const T*, const T*, float, int64_t);                    \
  template void add_backward<T>(T*, T*, const T*, float, int64_t);                 \
  template void mul<T>(T*, const T*, const T*, int64_t);                           \
  template void mul_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);    \
  template void scale<T>(T*, const T*, float, int64_t);                            \
  template void axpby<T>(T*, const T*, float, float, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
