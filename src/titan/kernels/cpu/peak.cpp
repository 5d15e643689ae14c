#include "titan/kernels/cpu/peak.h"

#include "titan/kernels/cpu/isa.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "titan/kernels/cpu/amx.h"
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
  // Keeps the chains alive without a reduction (GCC 12 warns falsely inside _mm512_reduce_add_ps).
  for (int k = 0; k < 12; ++k) asm volatile("" ::"v"(acc[k]));
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
// 24 independent chains: on Zen 5 the instruction's latency needs more than 12 in flight to fill
// both pipes (12 chains measured ~1000 GFLOP/s on 2 cores, 16 and 24 chains ~1070).
double peak_dot_bf16(int64_t iters) {
#if defined(__AVX512BF16__)
  constexpr int kChains = 24;
  __m512 acc[kChains];
  for (int k = 0; k < kChains; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 24
    for (int k = 0; k < kChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  // Keeps the chains alive without a reduction (GCC 12 warns falsely inside _mm512_reduce_add_ps).
  for (int k = 0; k < kChains; ++k) asm volatile("" ::"v"(acc[k]));
  return double(iters) * kChains * 16 * 4;
#else
  return peak_fma_f32(iters);
#endif
}

// TDPBF16PS on four independent 16x16 f32 accumulator tiles (tmm0-3) fed by two A tiles
// (tmm4-5, 16x32 bf16) and two B tiles (tmm6-7): 16 * 16 * 32 * 2 = 16384 FLOPs per instruction.
// The operands stay in tiles, so this is the tile unit's rate, not a memory-fed GEMM's.
double peak_amx_bf16(int64_t iters) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  for (int i = 0; i < 16 * 32; ++i) a[i] = 0x3f80, b[i] = 0x3380;  // bf16 1.0 and 2^-24: no overflow, no denormals
  amx_configure();
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  asm volatile("" ::"m"(out));
  return double(iters) * 4 * 16 * 16 * 32 * 2;
#else
  (void)iters;
  return 0;
#endif
}

}  // namespace titan::kernels::cpu::TITAN_ISA
