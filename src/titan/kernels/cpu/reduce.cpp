#include "titan/kernels/cpu/reduce.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Rows per thread chunk: enough that a chunk holds ~32K elements.
TITAN_INLINE int64_t row_grain(int64_t D) { return D >= (1 << 15) ? 1 : (1 << 15) / D; }

// Elements per block of a whole-buffer reduction. An f32 block sum of 16K elements (1K per SIMD
// lane) keeps ~1e-5 relative accuracy; blocks are summed in double.
constexpr int64_t kBlock = 1 << 14;

template <class T>
TITAN_INLINE float row_sum(const T* x, int64_t D) {
  float s = 0;
  // Scalar math: s = sum_j x_j
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < D; ++j) s += to_f32(x[j]);
  return s;
}

// x_j += g
template <class T>
TITAN_INLINE void add_to_row(T* x, float g, int64_t D) {
  // Scalar math: x_j += g
#pragma omp simd
  for (int64_t j = 0; j < D; ++j) x[j] = from_f32<T>(to_f32(x[j]) + g);
}

// The first index of the row's max (a row holding NaN gives an unspecified one).
template <class T>
TITAN_INLINE int64_t row_argmax(const T* x, int64_t D) {
  float m = to_f32(x[0]);
  // Scalar math: m = max_j x_j
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < D; ++j) {
    const float v = to_f32(x[j]);
    m = v > m ? v : m;
  }
  // Then the first index holding it: a scan from L1 that stops early, as the reference picks.
  int64_t first = 0;
  while (first < D - 1 && to_f32(x[first]) != m) ++first;
  return first;
}

// Sums f(x_i) over x[0, n) in fixed blocks: f32 within a block, double across blocks in order.
template <class T, class F>
double blocked_sum(const T* x, int64_t n, F block_sum) {
  if (n == 0) return 0;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  Scratch<double> partials(blocks);  // [blocks]
  parallel_for(0, blocks, 2, [&](int64_t lo, int64_t hi) {
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
      partials.data()[b] = double(block_sum(x + b * kBlock, end - b * kBlock));
    }
  });
  double total = 0;
  for (int64_t b = 0; b < blocks; ++b) total += partials.data()[b];
  return total;
}

}  // namespace

template <class T>
void sum_rows(T* y, const T* x, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(row_sum(x + i * D, D));
  });
}

template <class T>
void mean_rows(T* y, const T* x, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = from_f32<T>(row_sum(x + i * D, D) / float(D));
  });
}

template <class T>
void sum_rows_backward(T* dx, const T* dy, float scale, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) add_to_row(dx + i * D, scale * to_f32(dy[i]), D);
  });
}

template <class T>
void max_rows(T* y, int32_t* argmax, const T* x, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t first = row_argmax(x + i * D, D);
      y[i] = x[i * D + first];
      argmax[i] = int32_t(first);
    }
  });
}

template <class T>
void max_rows_backward(T* dx, const int32_t* argmax, const T* dy, int64_t N, int64_t D) {
  parallel_for(0, N, 1 << 12, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      T& g = dx[i * D + argmax[i]];
      g = from_f32<T>(to_f32(g) + to_f32(dy[i]));
    }
  });
}

template <class T>
double sum_all(const T* x, int64_t n) {
  return blocked_sum(x, n, [](const T* xb, int64_t len) { return row_sum(xb, len); });
}

// In double: a float's square is exact there, so the only rounding is the sum's (~1e-16), and
// the norm of gradients split into shards at any offset rounds to the same float clip factor as
// the norm of the whole tensors (FSDP reproduces the 1-rank run with clipping on).
template <class T>
double sum_squares(const T* x, int64_t n) {
  return blocked_sum(x, n, [](const T* xb, int64_t len) {
    double s = 0;
    // Scalar math: s = sum_i double(x_i)^2
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) {
      const double v = double(to_f32(xb[i]));
      s += v * v;
    }
    return s;
  });
}

#define TITAN_INSTANTIATE(T)                                                           \
  template void sum_rows<T>(T*, const T*, int64_t, int64_t);                           \
  template void mean_rows<T>(T*, const T*, int64_t, int64_t);                          \
  template void sum_rows_backward<T>(T*, const T*, float, int64_t, int64_t);           \
  template void max_rows<T>(T*, int32_t*, const T*, int64_t, int64_t);                 \
  template void max_rows_backward<T>(T*, const int32_t*, const T*, int64_t, int64_t);  \
  template double sum_all<T>(const T*, int64_t);                                       \
  template double sum_squares<T>(const T*, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
