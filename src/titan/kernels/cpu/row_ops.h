// Row primitives shared by the gather, scatter-add and embedding kernels. Per-ISA like isa.h:
// these templates live in the per-ISA namespace, so each variant keeps its own copies.
#pragma once

#include <type_traits>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/row_buckets.h"

namespace titan::kernels::cpu::TITAN_ISA {

// dst = w * src (w = 1 copies exactly, also for bf16 -> bf16)
template <class TD, class TS>
TITAN_INLINE void scale_row(TD* dst, const TS* src, float w, int64_t d) {
  // Scalar math: dst = w * src
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) dst[j] = from_f32<TD>(w * to_f32(src[j]));
}

// acc += w * src, in f32
template <class TS>
TITAN_INLINE void axpy_row(float* acc, const TS* src, float w, int64_t d) {
  // Scalar math: acc += w * src
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) acc[j] += w * to_f32(src[j]);
}

template <class TA, class TB>
TITAN_INLINE float dot_row(const TA* a, const TB* b, int64_t d) {
  float sum = 0;
  // Scalar math: sum += a * b (per-lane partial sums: a fixed order for a given ISA)
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < d; ++j) sum += to_f32(a[j]) * to_f32(b[j]);
  return sum;
}

// dst[dests[b]] = dst[dests[b]] + sum over its sources i (ascending) of w[i] * src[i], summed in
// f32 and rounded to TD once. Destination rows are split between threads, so no two threads
// write one row, and each row's order of additions is fixed.
template <class TD, class TS>
void scatter_add_rows_bucketed(TD* dst,                 // [R, D]
                               const TS* src,           // [M, D]
                               const float* w,          // [M] or nullptr (all 1)
                               const RowBucketsView& b, int64_t d) {
  const int64_t grain = (1 << 14) / (d + 1) + 1;
  parallel_for(0, b.count, grain, [&](int64_t lo, int64_t hi) {
    // An f32 row to sum into when the destination is bf16 (f32 destinations are summed in place).
    const Scratch<float> scratch(std::is_same_v<TD, float> ? 0 : d);
    for (int64_t k = lo; k < hi; ++k) {
      TD* out = dst + int64_t(b.dests[k]) * d;
      float* acc;
      if constexpr (std::is_same_v<TD, float>) {
        acc = out;
      } else {
        acc = scratch.data();
        // Scalar math: acc = out
#pragma omp simd
        for (int64_t j = 0; j < d; ++j) acc[j] = to_f32(out[j]);
      }
      for (int64_t s = b.starts[k]; s < b.starts[k + 1]; ++s) {
        const int64_t i = b.sources[s];
        axpy_row(acc, src + i * d, w ? w[i] : 1.0f, d);
      }
      if constexpr (!std::is_same_v<TD, float>) scale_row(out, acc, 1.0f, d);
    }
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
