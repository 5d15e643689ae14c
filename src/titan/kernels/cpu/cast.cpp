#include "titan/kernels/cpu/cast.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

#if defined(__AVX512BF16__)
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

}  // namespace titan::kernels::cpu::TITAN_ISA
