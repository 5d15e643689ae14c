#include "titan/kernels/cpu/peak.h"

#include "titan/kernels/cpu/isa.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace titan::kernels::cpu::TITAN_ISA {

// 12 independent accumulators: enough to cover FMA latency (4 cycles) x 2 pipes with margin.
double peak_fma_f32(int64_t iters) {
#if defined(__AVX512F__)
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  }
  float sink = 0;
  for (int k = 0; k < 12; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  asm volatile("" ::"x"(sink));
  return double(iters) * 12 * 16 * 2;
#elif defined(__AVX2__)
  __m256 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm256_set1_ps(float(k) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  }
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm256_add_ps(s, acc[k]);
  _mm256_store_ps(out, s);
  asm volatile("" ::"m"(out));
  return double(iters) * 12 * 8 * 2;
#else
  float acc[12][4];
  for (int k = 0; k < 12; ++k)
    for (int l = 0; l < 4; ++l) acc[k][l] = float(k + l) * 1e-3f;
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 12; ++k)
      for (int l = 0; l < 4; ++l) acc[k][l] = acc[k][l] * 0.999999f + 1e-7f;
  asm volatile("" ::"m"(acc));
  return double(iters) * 12 * 4 * 2;
#endif
}

// VDPBF16PS: per 32-bit lane, two bf16 products added to an f32 accumulator (4 FLOPs per lane).
// Without AVX512_BF16 this returns the f32 figure: bf16 GEMMs then run at the f32 rate.
double peak_dot_bf16(int64_t iters) {
#if defined(__AVX512BF16__)
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  float sink = 0;
  for (int k = 0; k < 12; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  asm volatile("" ::"x"(sink));
  return double(iters) * 12 * 16 * 4;
#else
  return peak_fma_f32(iters);
#endif
}

}  // namespace titan::kernels::cpu::TITAN_ISA
