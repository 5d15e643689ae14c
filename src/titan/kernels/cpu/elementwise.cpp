#include "titan/kernels/cpu/elementwise.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
constexpr int64_t kGrain = 1 << 15;  // elements per thread chunk: below this, threads cost more than they save

// One accumulate pass g += c * v, the shared body of the backward kernels.
template <class T>
TITAN_INLINE void accumulate_scaled(T* g, const T* v, float c, int64_t lo, int64_t hi) {
  // Scalar math: g += c * v
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) g[i] = from_f32<T>(to_f32(g[i]) + c * to_f32(v[i]));
}
}  // namespace

template <class T>
void add(T* y, const T* a, const T* b, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = a + alpha * b
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(to_f32(a[i]) + alpha * to_f32(b[i]));
  });
}

template <class T>
void add_backward(T* da, T* db, const T* dy, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (da && db) {
      // Scalar math: da += dy; db += alpha * dy (dy read once for both)
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const float g = to_f32(dy[i]);
        da[i] = from_f32<T>(to_f32(da[i]) + g);
        db[i] = from_f32<T>(to_f32(db[i]) + alpha * g);
      }
    } else if (da) {
      accumulate_scaled(da, dy, 1.0f, lo, hi);
    } else if (db) {
      accumulate_scaled(db, dy, alpha, lo, hi);
    }
  });
}

template <class T>
void mul(T* y, const T* a, const T* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = a * b
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(to_f32(a[i]) * to_f32(b[i]));
  });
}

template <class T>
void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (da && db) {
      // Scalar math: da += dy * b; db += dy * a
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) {
        const float g = to_f32(dy[i]);
        const float av = to_f32(a[i]), bv = to_f32(b[i]);
        da[i] = from_f32<T>(to_f32(da[i]) + g * bv);
        db[i] = from_f32<T>(to_f32(db[i]) + g * av);
      }
    } else if (da || db) {
      T* g_out = da ? da : db;
      const T* other = da ? b : a;
      // Scalar math: g_out += dy * other
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) g_out[i] = from_f32<T>(to_f32(g_out[i]) + to_f32(dy[i]) * to_f32(other[i]));
    }
  });
}

template <class T>
void scale(T* y, const T* x, float alpha, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = alpha * x
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(alpha * to_f32(x[i]));
  });
}

template <class T>
void axpby(T* y, const T* x, float alpha, float beta, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = alpha * x + beta * y
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(alpha * to_f32(x[i]) + beta * to_f32(y[i]));
  });
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
