// bf16 pair (VNNI) operand helpers shared by the bf16 kernels of kernels/cpu/ on AMX tiles
// (cpu/amx.h) and on AVX512-BF16 vectors (VDPBF16PS, for CPUs without AMX). Both products take
// the same operand layouts: A rows of bf16 pairs (two consecutive k), B rows of 16 pairs by
// column (pair = two consecutive k, the even one in the low half). Included only in the
// avx512_bf16 variant.
#pragma once

#if !defined(__AVX512BF16__)
#error "cpu/bf16_pairs.h is for the avx512_bf16 variant only"
#endif

#include <immintrin.h>

#include <cstring>

#include "titan/kernels/cpu/isa.h"
// After isa.h, which defines TITAN_AVX512_ROWS: the avx512_bf16 variant is also the AVX-512 rows variant.
#include "titan/kernels/cpu/avx512.h"

namespace titan::kernels::cpu::TITAN_ISA {

// One bf16 pair (VNNI element): lo in the low half.
TITAN_INLINE uint32_t pack_pair(bf16 lo, bf16 hi) { return uint32_t(lo.bits) | uint32_t(hi.bits) << 16; }

// 32 bf16 [r0[0..16) | r1[0..16)] (as _mm512_cvtne2ps_pbh(r1, r0) gives them) as 16 VNNI pairs
// (r0[i] low, r1[i] high): one 64-byte row of a B operand built from two consecutive rows.
TITAN_INLINE __m512i vnni_interleave(__m512i halves) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), halves);
}

// 16 f32 values of rows r0 and r1 as 16 VNNI pairs (bf16, round to nearest even).
TITAN_INLINE __m512i pack_pair_ps(__m512 r0, __m512 r1) {
  return vnni_interleave((__m512i)_mm512_cvtne2ps_pbh(r1, r0));
}

// 32 columns of two bf16 rows (a = row 0, b = row 1) as VNNI pairs, in two 2-source word permutes:
// lo holds columns 0-15, hi columns 16-31 (row 0's value in each pair's low half).
TITAN_INLINE void row_pair_vectors(__m512i a, __m512i b, __m512i& lo, __m512i& hi) {
  const __m512i idx_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                          37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  lo = _mm512_permutex2var_epi16(a, idx_lo, b);
  hi = _mm512_permutex2var_epi16(a, _mm512_add_epi16(idx_lo, _mm512_set1_epi16(16)), b);
}

// One VNNI row of a bf16 pair of rows (the B layout of AMX's bf16 product): dst[col] holds
// v0[col] in its low and v1[col] in its high half; v1 null (the last, unpaired key) gives zeros.
TITAN_INLINE void pack_row_pair(uint32_t* dst, const bf16* v0, const bf16* v1, int64_t width) {
  if (v1 && width % 32 == 0) {
    for (int64_t col = 0; col < width; col += 32) {
      __m512i lo, hi;
      row_pair_vectors(_mm512_loadu_si512(v0 + col), _mm512_loadu_si512(v1 + col), lo, hi);
      _mm512_storeu_si512(dst + col, lo);
      _mm512_storeu_si512(dst + col + 16, hi);
    }
    return;
  }
  if (!v1) {
#pragma omp simd
    for (int64_t col = 0; col < width; ++col) dst[col] = uint32_t(v0[col].bits);
    return;
  }
#pragma omp simd
  for (int64_t col = 0; col < width; ++col) dst[col] = uint32_t(v0[col].bits) | uint32_t(v1[col].bits) << 16;
}

// dst[col, j) for col < 16 (rows dst_ld apart) and j < round_up((n + 1) / 2, 16) = the bf16 pair
// (src[2j, col], src[2j + 1, col]) of the f32 matrix src [n, 16+] (rows src_ld apart), rows past
// n read as 0, each column col first multiplied by mul[col] when mul is not null: an [n, 16]
// slot-by-head f32 block becomes the A operand (heads by slot pairs) of a heads-times-selected-
// rows product, with vectorized rounding and 16 x 16 transposes instead of a scalar loop per
// element.
TITAN_INLINE void pack_pairs_transposed(uint32_t* dst, int64_t dst_ld, const float* src, int64_t src_ld, int64_t n,
                                        const float* mul) {
  // interleaves [a0..a15 | b0..b15] (bf16) into the pairs (a0, b0), (a1, b1), ...
  const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                         6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  alignas(64) uint32_t blk[16 * 16];
  const __m512 m = mul ? _mm512_loadu_ps(mul) : _mm512_set1_ps(1.0f);
  const int64_t n2 = (n + 1) / 2;
  for (int64_t j0 = 0; j0 < n2; j0 += 16) {
    for (int64_t j = 0; j < 16; ++j) {
      const int64_t i = 2 * (j0 + j);
      const __m512 r0 = i < n ? _mm512_mul_ps(_mm512_loadu_ps(src + i * src_ld), m) : _mm512_setzero_ps();
      const __m512 r1 = i + 1 < n ? _mm512_mul_ps(_mm512_loadu_ps(src + (i + 1) * src_ld), m) : _mm512_setzero_ps();
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(r1, r0));  // [r0 | r1] in bf16
      _mm512_store_si512(blk + j * 16, _mm512_permutexvar_epi16(inter, both));
    }
    transpose16_u32(dst + j0, dst_ld, blk, 16);
  }
}

// dst[k, h] (rows dst_ld apart) = the bf16 pair (x[h, 2k], x[h, 2k + 1]) for k < width / 2 and h
// < round_up(rows, 16), heads past `rows` 0: x [rows, width] (width a multiple of 32) becomes the
// B operand (column pairs by head) of a selected-rows-times-heads product, in 16 x 16 transposes.
inline void pack_heads_vnni(uint32_t* dst, int64_t dst_ld, const bf16* x, int64_t rows, int64_t width) {
  const int64_t w2 = width / 2;
  alignas(64) uint32_t blk[16 * 16];
  for (int64_t h0 = 0; h0 < rows; h0 += 16) {
    const bf16* x0 = x + h0 * width;
    for (int64_t k0 = 0; k0 < w2; k0 += 16) {
      if (h0 + 16 <= rows) {
        transpose16_u32(dst + k0 * dst_ld + h0, dst_ld, reinterpret_cast<const uint32_t*>(x0 + 2 * k0), w2);
        continue;
      }
      for (int64_t h = 0; h < 16; ++h) {  // the last, partial head group
        if (h0 + h < rows) std::memcpy(blk + h * 16, x0 + h * width + 2 * k0, 64);
        else std::memset(blk + h * 16, 0, 64);
      }
      transpose16_u32(dst + k0 * dst_ld + h0, dst_ld, blk, 16);
    }
  }
}

// dst[0, n) = src[0, n) rounded to bf16 (round to nearest even, as f32_to_bf16), 32 at a time.
TITAN_INLINE void store_bf16(bf16* dst, const float* src, int64_t n) {
  int64_t c = 0;
  for (; c + 32 <= n; c += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + c + 16), _mm512_loadu_ps(src + c));
    _mm512_storeu_si512(dst + c, reinterpret_cast<__m512i>(v));
  }
  for (; c < n; ++c) dst[c] = f32_to_bf16(src[c]);
}

// sum_c a[c] b[c] over c < n (a multiple of 16), bf16 inputs widened exactly, f32 sums.
TITAN_INLINE float dot_bf16(const bf16* a, const bf16* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __m512 x = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c))), 16));
    const __m512 y = _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + c))), 16));
    acc = _mm512_fmadd_ps(x, y, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace titan::kernels::cpu::TITAN_ISA
