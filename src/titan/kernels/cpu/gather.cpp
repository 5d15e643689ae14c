#include "titan/kernels/cpu/gather.h"

#include "titan/kernels/cpu/row_ops.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Rows per thread chunk so a chunk moves about 64 KiB: below that, threads cost more than they save.
int64_t row_grain(int64_t d) { return (1 << 14) / (d + 1) + 1; }
}  // namespace

template <class T>
void gather_rows_forward(T* y, const T* x, const int32_t* idx, const float* w, int64_t m, int64_t d) {
  parallel_for(0, m, row_grain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) scale_row(y + i * d, x + int64_t(idx[i]) * d, w ? w[i] : 1.0f, d);
  });
}

template <class T>
void gather_rows_backward(T* dx, float* dw, const T* dy, const T* x, const int32_t* idx, const float* w,
                          const RowBucketsView& buckets, int64_t m, int64_t d) {
  if (dx) scatter_add_rows_bucketed(dx, dy, w, buckets, d);
  if (dw) {
    parallel_for(0, m, row_grain(d), [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) dw[i] += dot_row(dy + i * d, x + int64_t(idx[i]) * d, d);
    });
  }
}

template <class T>
void scatter_add_rows_forward(T* y, const T* x, const float* w, const RowBucketsView& buckets, int64_t d) {
  scatter_add_rows_bucketed(y, x, w, buckets, d);
}

template <class T>
void scatter_add_rows_backward(T* dx, float* dw, const T* dy, const T* x, const int32_t* idx, const float* w,
                               int64_t m, int64_t d) {
  parallel_for(0, m, row_grain(d), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* g = dy + int64_t(idx[i]) * d;
      if (dx) {
        const float wi = w ? w[i] : 1.0f;
        T* out = dx + i * d;
        // Scalar math: dx[i] += w[i] * dy[idx[i]]
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) out[j] = from_f32<T>(to_f32(out[j]) + wi * to_f32(g[j]));
      }
      if (dw) dw[i] += dot_row(g, x + i * d, d);
    }
  });
}

#define TITAN_INSTANTIATE(T)                                                                                  \
  template void gather_rows_forward<T>(T*, const T*, const int32_t*, const float*, int64_t, int64_t);          \
  template void gather_rows_backward<T>(T*, float*, const T*, const T*, const int32_t*, const float*,         \
                                        const RowBucketsView&, int64_t, int64_t);                             \
  template void scatter_add_rows_forward<T>(T*, const T*, const float*, const RowBucketsView&, int64_t);      \
  template void scatter_add_rows_backward<T>(T*, float*, const T*, const T*, const int32_t*, const float*, int64_t, \
                                             int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
