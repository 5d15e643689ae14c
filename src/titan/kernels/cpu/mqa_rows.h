// Pieces shared by the kernels that run every query head against the same gathered key rows
// (MQA over a per-query row set: sparse MLA's selected latent rows, DeepSeek-V4's window and
// compressed entries). Per-ISA like isa.h: these live in the per-ISA namespace.
#pragma once

#include <cstdint>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/tile_gemm.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

// The products' register tiles (cpu/tile_gemm.h), depth unchunked. AVX-512 uses 8 x 3: 16 heads
// fill two row tiles exactly, and a one-vector tile (the scores of 16 heads) still has 8
// independent FMA chains (about 8% less CPU time than 6 x 4 at H = 16). Every product's rows are
// padded to whole row tiles by the caller.
struct MqaTiles : TileDefaults {
#if defined(__AVX512F__)
  static constexpr int kRows = 8, kVecs = 3;
#elif defined(__AVX2__)
  static constexpr int kRows = 6, kVecs = 2;
#else
  static constexpr int kRows = 4, kVecs = 2;
#endif
  static constexpr int kNarrowRows = kRows;
  static constexpr bool kRowTails = false;
};

// dst[c * ld_dst + r] = scale * src[r * ld_src + c] for r < rows, c < cols: the heads' rows of q
// (or dO) as the head columns of a B operand. Whole 16 x 16 f32 blocks are transposed in
// shuffles; the rest (partial blocks, bf16) element by element. Element by element throughout,
// with each store ld_dst floats past the last, this cost a query about as many scalar operations
// (~35k at H = 16, Dqk + Dv = 1088) as its score product has vector FMAs.
template <class T>
void transpose_heads(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols,
                     float scale) {
  int64_t rows_done = 0, cols_done = 0;  // the block [0, rows_done) x [0, cols_done) done in shuffles
#if defined(TITAN_AVX512_ROWS)
  if constexpr (std::is_same_v<T, float>) {
    rows_done = rows / 16 * 16, cols_done = cols / 16 * 16;
    alignas(64) uint32_t blk[16 * 16];
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows_done; r0 += 16) {
      for (int64_t c0 = 0; c0 < cols_done; c0 += 16) {
        transpose16_u32(blk, 16, reinterpret_cast<const uint32_t*>(src + r0 * ld_src + c0), ld_src);
        // Scalar math: dst[c0 + i][r0, r0 + 16) = scale * (the 16 x 16 block of src, transposed)[i]
        for (int64_t i = 0; i < 16; ++i) {
          _mm512_storeu_ps(dst + (c0 + i) * ld_dst + r0,
                           _mm512_mul_ps(sv, _mm512_castsi512_ps(_mm512_load_si512(blk + 16 * i))));
        }
      }
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    // Scalar math: dst[c][r] = scale * src[r][c]
    for (int64_t c = r < rows_done ? cols_done : 0; c < cols; ++c) dst[c * ld_dst + r] = scale * to_f32(src[r * ld_src + c]);
  }
}

// Softmax over the n >= 1 key rows of st [n, Hs] (column h: head h), vectorized across heads:
// st becomes P = exp(s - lse) and lse[h] the normalizer, for every h < Hs (padding heads see 0s).
// sum is [Hs] scratch.
inline void softmax_over_keys(float* st, int64_t n, int64_t Hs, float* lse, float* sum) {
  for (int64_t h = 0; h < Hs; ++h) lse[h] = -__builtin_inff(), sum[h] = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = st + i * Hs;
    // Scalar math: m = max(m, s)
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) lse[h] = row[h] > lse[h] ? row[h] : lse[h];
  }
  for (int64_t i = 0; i < n; ++i) {
    const float* row = st + i * Hs;
    // Scalar math: l += exp(s - m)
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) sum[h] += fast_exp(row[h] - lse[h]);
  }
  // the libm call, not a wrapper shared across ISAs
  for (int64_t h = 0; h < Hs; ++h) lse[h] += __builtin_logf(sum[h]);
  for (int64_t i = 0; i < n; ++i) {
    float* row = st + i * Hs;
    // Scalar math: P = exp(s - lse)
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) row[h] = fast_exp(row[h] - lse[h]);
  }
}

// The backward's rows [s | dA] of st [n, 2 Hs] (s: the scaled scores, dA = dO . value row) become
// (scale dS | P), the A operand of dq and of the key rows: P = exp(s - lse) recomputed,
// dS = P (dA - Delta) with Delta = rowsum(dO * O) per head.
inline void scores_to_grads(float* st, int64_t n, int64_t Hs, const float* lse, const float* delta, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = st + i * 2 * Hs;
    // Scalar math: P = exp(s - lse); row = (scale P (dA - Delta) | P)
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) {
      const float ph = fast_exp(row[h] - lse[h]);
      row[h] = scale * ph * (row[Hs + h] - delta[h]);
      row[Hs + h] = ph;
    }
  }
}

// dst [d] = row s of every part of the per-thread accumulators acc [parts, rows, ld], summed in
// part order in f32 and rounded to T once; every part's row s is left zero.
template <class T>
inline void sum_partial_rows(T* dst, int64_t d, float* acc, int64_t s, int64_t rows, int64_t parts, int64_t ld) {
  float* first = acc + s * ld;
  for (int64_t part = 1; part < parts; ++part) {
    float* row = acc + (part * rows + s) * ld;
    // Scalar math: first += the partial; partial = 0
#pragma omp simd
    for (int64_t col = 0; col < ld; ++col) first[col] += row[col], row[col] = 0.0f;
  }
  // Scalar math: dst = sum of the partials
#pragma omp simd
  for (int64_t col = 0; col < d; ++col) dst[col] = from_f32<T>(first[col]);
  // Scalar math: first = 0
#pragma omp simd
  for (int64_t col = 0; col < ld; ++col) first[col] = 0.0f;
}

}  // namespace titan::kernels::cpu::TITAN_ISA
