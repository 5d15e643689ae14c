#include "titan/kernels/cpu/cross_entropy.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
constexpr int64_t kChunk = 4096;  // vocabulary entries per chunk: 16 KiB of f32, stays in L1 between its two reads
constexpr float kInf = __builtin_inff();

#if defined(TITAN_AVX512_ROWS)
// The avx512_bf16 variant (cpu/avx512.h). Terms are 2^(x log2e - M) with M = fl(m log2e) one
// FMA each; d = m log2e - M (exact through an FMA) is the rounding of M, which scales every
// term by 2^d and is taken back out once per row.
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147180559945309f;

// Requests the 32 entries kChunk past p into L2 (prefetches never fault, past the end either).
template <class T>
TITAN_INLINE void prefetch_next_chunk(const T* p) {
  for (int64_t b = 0; b < int64_t(32 * sizeof(T)); b += 64) __builtin_prefetch(reinterpret_cast<const char*>(p + kChunk) + b, 0, 2);
}

// log(sum_j exp(x_j)) over a row of v entries: chunk max, then its terms from L1, with the
// running sum rescaled whenever the max rises.
template <class T>
TITAN_INLINE float row_lse_avx512(const T* row, int64_t v) {
  float m = -kInf, M = -kInf;  // running max, and fl(m log2e)
  __m512 s = _mm512_setzero_ps();  // per lane: sum of 2^(x log2e - M)
  const __m512 log2e = _mm512_set1_ps(kLog2e);
  for (int64_t c0 = 0; c0 < v; c0 += kChunk) {
    const int64_t c1 = c0 + kChunk < v ? c0 + kChunk : v;
    const float cm = max_span(row + c0, c1 - c0);
    if (cm == -kInf) continue;  // all -inf: adds nothing (and -inf - -inf would be NaN)
    if (cm > m) {
      const float new_M = cm * kLog2e;
      s = _mm512_mul_ps(s, exp2_16(_mm512_set1_ps(M - new_M)));  // M = -inf (first chunk): s stays 0
      m = cm;
      M = new_M;
    }
    const __m512 vM = _mm512_set1_ps(M);
    __m512 s1 = _mm512_setzero_ps();
    // Scalar math: s += exp(x - m)
    int64_t j = c0;
    for (; j + 32 <= c1; j += 32) {
      // The next chunk (past the row's end: the next row's start) into L2 while this one's exp
      // runs from L1, so memory works during the arithmetic, not only during the max pass.
      prefetch_next_chunk(row + j);
      s = _mm512_add_ps(s, exp2_16(_mm512_fmsub_ps(load16(row + j), log2e, vM)));
      s1 = _mm512_add_ps(s1, exp2_16(_mm512_fmsub_ps(load16(row + j + 16), log2e, vM)));
    }
    for (; j < c1; j += 16) {
      const __mmask16 k = lanes(c1 - j);
      s = _mm512_mask_add_ps(s, k, s, exp2_16(_mm512_fmsub_ps(load16(row + j, k), log2e, vM)));
    }
    s = _mm512_add_ps(s, s1);
  }
  if (m == -kInf) return -kInf;  // an all -inf row: log(0), as the reference
  const float d = __builtin_fmaf(m, kLog2e, -M);
  return m + (__builtin_logf(hsum16(s)) - d * kLn2);
}

// out_j = exp(x_j - l) g over a row of v entries (out may be row).
template <class T>
TITAN_INLINE void row_grad_avx512(T* out, const T* row, int64_t v, float l, float g) {
  const float L = l * kLog2e, d = __builtin_fmaf(l, kLog2e, -L);
  // 2^(x log2e - L) = exp(x - l) 2^d: g takes the 2^-d back out.
  const __m512 vL = _mm512_set1_ps(L), vg = _mm512_set1_ps(g * fast_exp(-d * kLn2)), log2e = _mm512_set1_ps(kLog2e);
  int64_t j = 0;
  // Scalar math: out = exp(x - l) * g
  for (; j + 32 <= v; j += 32) {
    prefetch_next_chunk(row + j);  // as in row_lse_avx512: keeps memory busy during the arithmetic
    store16(out + j, _mm512_mul_ps(exp2_16(_mm512_fmsub_ps(load16(row + j), log2e, vL)), vg));
    store16(out + j + 16, _mm512_mul_ps(exp2_16(_mm512_fmsub_ps(load16(row + j + 16), log2e, vL)), vg));
  }
  for (; j + 16 <= v; j += 16)
    store16(out + j, _mm512_mul_ps(exp2_16(_mm512_fmsub_ps(load16(row + j), log2e, vL)), vg));
  if (j < v) {
    const __mmask16 k = lanes(v - j);
    store16(out + j, _mm512_mul_ps(exp2_16(_mm512_fmsub_ps(load16(row + j, k), log2e, vL)), vg), k);
  }
}
#endif
}  // namespace

template <class T>
void cross_entropy_forward(float* loss, float* lse, const T* logits, const int32_t* targets, int64_t n, int64_t v,
                           int32_t ignore_index) {
  parallel_for(0, n, (1 << 15) / v + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      if (targets[r] == ignore_index) {
        loss[r] = 0;
        lse[r] = 0;
        continue;
      }
      const T* row = logits + r * v;
#if defined(TITAN_AVX512_ROWS)
      lse[r] = row_lse_avx512(row, v);
#else
      float m = -kInf, s = 0;  // running max and sum of exp(x - m)
      for (int64_t c0 = 0; c0 < v; c0 += kChunk) {
        const int64_t c1 = c0 + kChunk < v ? c0 + kChunk : v;
        float cm = -kInf;
        // Scalar math: cm = max(x)
#pragma omp simd reduction(max : cm)
        for (int64_t j = c0; j < c1; ++j) cm = cm > to_f32(row[j]) ? cm : to_f32(row[j]);
        if (cm == -kInf) continue;  // all -inf: adds nothing (and -inf - -inf would be NaN)
        if (cm > m) {
          s *= fast_exp(m - cm);
          m = cm;
        }
        float cs = 0;
        // Scalar math: cs += exp(x - m)
#pragma omp simd reduction(+ : cs)
        for (int64_t j = c0; j < c1; ++j) cs += fast_exp(to_f32(row[j]) - m);
        s += cs;
      }
      lse[r] = m + __builtin_logf(s);  // the libm call, not an inline wrapper shared across ISA variants
#endif
      loss[r] = lse[r] - to_f32(row[targets[r]]);
    }
  });
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                            float scale, int64_t n, int64_t v, int32_t ignore_index) {
  parallel_for(0, n, (1 << 15) / v + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      T* out = dlogits + r * v;
      const int32_t t = targets[r];
      if (t == ignore_index) {
        // Scalar math: dlogits = 0
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) out[j] = from_f32<T>(0.0f);
        continue;
      }
      const T* row = logits + r * v;
      const float g = scale * (dloss ? dloss[r] : 1.0f);
      const float l = lse[r];
      const float target_logit = to_f32(row[t]);  // read before the loop: out may be row
#if defined(TITAN_AVX512_ROWS)
      row_grad_avx512(out, row, v, l, g);
#else
      // Scalar math: dlogits = exp(x - lse) * g
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) out[j] = from_f32<T>(fast_exp(to_f32(row[j]) - l) * g);
#endif
      out[t] = from_f32<T>((fast_exp(target_logit - l) - 1.0f) * g);
    }
  });
}

template void cross_entropy_forward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, int32_t);
template void cross_entropy_forward<bf16>(float*, float*, const bf16*, const int32_t*, int64_t, int64_t, int32_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, const float*, const float*, float,
                                            int64_t, int64_t, int32_t);
template void cross_entropy_backward<bf16>(bf16*, const bf16*, const int32_t*, const float*, const float*, float,
                                           int64_t, int64_t, int32_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
