// AVX-512 helpers for the row kernels of the avx512_bf16 variant (softmax, RoPE, cross-entropy):
// f32 and bf16 rows loaded and stored as 16 f32 lanes (tails through lane masks), and 2^t.
// Included only inside `#if defined(TITAN_AVX512_ROWS)`, which is set in the avx512_bf16
// variant; the other variants keep their `#pragma omp simd` loops.
//
// Why hand-written: GCC vectorizes fast_exp (cpu/isa.h) into ~27 instructions per vector (its
// clamps and 2^n are integer work) and f32_to_bf16 into ~6; VSCALEFPS and VRNDSCALEPS do 2^n
// and the rounding in one instruction each, and VCVTNEPS2BF16 rounds 16 lanes at once. In bf16
// row kernels that arithmetic, not memory, was the limit.
#pragma once

#if !defined(TITAN_AVX512_ROWS)
#error "cpu/avx512.h is for the avx512_bf16 variant only (check TITAN_AVX512_ROWS first)"
#endif

#include <immintrin.h>

#include "titan/kernels/cpu/isa.h"

// GCC 12's AVX-512 intrinsics fill their unused pass-through operand with a self-initialized
// "undefined" vector, which -Wmaybe-uninitialized reports once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace titan::kernels::cpu::TITAN_ISA {

// The lanes of a 16-lane step that hold elements when n (< 16 allowed, >= 16: all) remain.
TITAN_INLINE __mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// 16 elements as f32 lanes; the masked forms read only the lanes in k (the rest are 0).
TITAN_INLINE __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
TITAN_INLINE __m512 load16(const bf16* p) {
  // bf16 -> f32 is exact: the 16 bits become the high half of the f32.
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
TITAN_INLINE __m512 load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
TITAN_INLINE __m512 load16(const bf16* p, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}

// Stores 16 f32 lanes as T; bf16 rounds to nearest even and quiets NaNs, as f32_to_bf16.
TITAN_INLINE void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
TITAN_INLINE void store16(bf16* p, __m512 v) { _mm256_storeu_si256((__m256i*)p, (__m256i)_mm512_cvtneps_pbh(v)); }
TITAN_INLINE void store16(float* p, __m512 v, __mmask16 k) { _mm512_mask_storeu_ps(p, k, v); }
TITAN_INLINE void store16(bf16* p, __m512 v, __mmask16 k) {
  _mm256_mask_storeu_epi16(p, k, (__m256i)_mm512_cvtneps_pbh(v));
}

// The max and the sum of the 16 lanes (GCC 12's _mm512_reduce_* warn of uninitialized parts, and
// so do its unmasked shuffles once inlined: the maskz forms have no undefined operand).
TITAN_INLINE float hmax16(__m512 v) {
  v = _mm512_max_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, 0x4e));  // swap 256-bit halves
  v = _mm512_max_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, 0xb1));  // swap 128-bit quarters
  v = _mm512_max_ps(v, _mm512_maskz_permute_ps(0xffff, v, 0x4e));        // swap lane pairs
  v = _mm512_max_ps(v, _mm512_maskz_permute_ps(0xffff, v, 0xb1));        // swap lanes
  return _mm512_cvtss_f32(v);
}
TITAN_INLINE float hsum16(__m512 v) {
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(0xffff, v, v, 0xb1));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(0xffff, v, 0x4e));
  v = _mm512_add_ps(v, _mm512_maskz_permute_ps(0xffff, v, 0xb1));
  return _mm512_cvtss_f32(v);
}

// The max of x[0, n) (-inf for n = 0), in two vector chains: the max's latency, not the loads,
// would limit one.
template <class T>
TITAN_INLINE float max_span(const T* x, int64_t n) {
  __m512 m0 = _mm512_set1_ps(-__builtin_inff()), m1 = m0;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm512_max_ps(m0, load16(x + j));
    m1 = _mm512_max_ps(m1, load16(x + j + 16));
  }
  for (; j < n; j += 16) {
    const __mmask16 k = lanes(n - j);
    m0 = _mm512_mask_max_ps(m0, k, m0, load16(x + j, k));
  }
  return hmax16(_mm512_max_ps(m0, m1));
}

// 2^t per lane, for t <= 127 (softmax-style arguments, shifted by the row max, are <= 0): the
// Taylor polynomial of 2^f (coefficients ln2^k / k!, degree 6: ~2 ulp, as fast_exp) on the
// fraction f = t - round(t) in [-1/2, 1/2], scaled by 2^round(t) with VSCALEFPS. Results below
// 2^-125 are 0 (never subnormal, like fast_exp), -inf gives 0, NaN stays NaN.
// exp(x - m) = 2^(x log2e - m log2e): one FMA forms t, and the rounding of m log2e scales every
// term of a row alike, which normalization (softmax, log-sum-exp) cancels.
TITAN_INLINE __m512 exp2_16(__m512 t) {
  constexpr float kLn2 = 0.693147180559945309f;
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);  // exact
  __m512 p = _mm512_set1_ps(kLn2 * kLn2 * kLn2 * kLn2 * kLn2 * kLn2 / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2 * kLn2 * kLn2 * kLn2 * kLn2 / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2 * kLn2 * kLn2 * kLn2 / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2 * kLn2 * kLn2 / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2 * kLn2 / 2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kLn2));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  // Lanes with t >= -125 or NaN (unordered) keep their value; the rest, -inf included, are 0.
  const __mmask16 keep = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, n);
}

// 2^t in the lanes of k (the others 0) for probabilities that become bf16 tile operands (AMX
// attention's P): relative error below 8e-5, far under bf16's rounding step (2^-8), in 6 vector
// instructions instead of exp2_16's 10, since there the softmax vector work, which does not
// overlap the tile instructions, bounds the kernel with them. f = t - floor(t) in [0, 1) in one
// VREDUCEPS; a cubic fitted to 2^f on [0, 1) for minimal relative error (weighted least squares);
// VSCALEFPS multiplies by 2^floor(t). Same ranges as exp2_16: t <= 127, results below 2^-125 are
// 0, -inf gives 0, NaN stays NaN.
TITAN_INLINE __m512 exp2_16_operand(__m512 t, __mmask16 k) {
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(0.07802403f), f, _mm512_set1_ps(0.22606707f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.69583398f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.99992514f));
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(k, t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  return _mm512_maskz_scalef_ps(keep, p, t);
}

// dst row r (r < 16, dst_ld elements apart) = column r of the 16 x 16 block src (rows src_ld
// apart), 32-bit elements, in AVX-512 shuffles: 32-bit and 64-bit unpacks gather 4 x 4 blocks
// within each 128-bit lane, two rounds of 128-bit lane shuffles put the lanes in order.
TITAN_INLINE void transpose16_u32(uint32_t* dst, int64_t dst_ld, const uint32_t* src, int64_t src_ld) {
  __m512i r[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_ld);
  for (int g = 0; g < 4; ++g) {
    const __m512i t0 = _mm512_unpacklo_epi32(r[4 * g], r[4 * g + 1]);
    const __m512i t1 = _mm512_unpackhi_epi32(r[4 * g], r[4 * g + 1]);
    const __m512i t2 = _mm512_unpacklo_epi32(r[4 * g + 2], r[4 * g + 3]);
    const __m512i t3 = _mm512_unpackhi_epi32(r[4 * g + 2], r[4 * g + 3]);
    // lane L of u[4g + m] = rows 4g..4g+3 of column 4L + m
    u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512i va = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x88), vb = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xDD);
    const __m512i wa = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x88);
    const __m512i wb = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xDD);
    _mm512_storeu_si512(dst + m * dst_ld, _mm512_shuffle_i32x4(va, wa, 0x88));
    _mm512_storeu_si512(dst + (4 + m) * dst_ld, _mm512_shuffle_i32x4(vb, wb, 0x88));
    _mm512_storeu_si512(dst + (8 + m) * dst_ld, _mm512_shuffle_i32x4(va, wa, 0xDD));
    _mm512_storeu_si512(dst + (12 + m) * dst_ld, _mm512_shuffle_i32x4(vb, wb, 0xDD));
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
