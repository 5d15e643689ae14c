#include "titan/kernels/cpu/cast.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

#if defined(__AVX512BF16__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
constexpr int64_t kGrain = 1 << 15;  // elements per thread chunk: below this, threads cost more than they save
}

void cast_f32_to_bf16(bf16* y, const float* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
#if defined(__AVX512BF16__)
    // VCVTNE2PS2BF16 rounds to nearest even and quiets NaNs, matching f32_to_bf16.
    for (; i + 32 <= hi; i += 32) {
      const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
      _mm512_storeu_si512(y + i, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
#endif
    // Scalar math: y = f32_to_bf16(x)
#pragma omp simd
    for (int64_t j = i; j < hi; ++j) y[j] = f32_to_bf16(x[j]);
  });
}

void cast_bf16_to_f32(float* y, const bf16* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    // Scalar math: y = bits(x) << 16 (exact)
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) y[j] = bf16_to_f32(x[j]);
  });
}

// F16C (the avx2 and avx512_bf16 levels; every x86 CPU with AVX2 has it) converts 8 at a time,
// rounding to nearest even with overflow to infinity, as f32_to_f16 does. Zen 5 has no
// AVX512-FP16, so the 512-bit forms are not used; the baseline level converts in scalar code.
void cast_f32_to_f16(f16* y, const float* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
#if defined(__F16C__)
    for (; i + 8 <= hi; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (int64_t j = i; j < hi; ++j) y[j] = f32_to_f16(x[j]);
  });
}

void cast_f16_to_f32(float* y, const f16* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    int64_t i = lo;
#if defined(__F16C__)
    for (; i + 8 <= hi; i += 8)
      _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))));
#endif
    for (int64_t j = i; j < hi; ++j) y[j] = f16_to_f32(x[j]);  // exact
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
