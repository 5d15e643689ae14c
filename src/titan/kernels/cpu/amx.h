// AMX bf16 tile helpers shared by the kernels in kernels/cpu/ (sparse MLA, attention, ...).
// Included only inside `#if defined(__AMX_TILE__) && defined(__AMX_BF16__)`, i.e. in the
// avx512_bf16 variant; callers also check cpu_amx_bf16_usable() at run time and call
// amx_configure() on each thread before the first tile instruction (and _tile_release() after).
//
// TDPBF16PS runs 16 x 16 f32 tile products on bf16 operands, which the vector units (f32 FMA, or
// VDPBF16PS at about the same rate here) cannot approach. Operand layouts: A tiles are 16 rows of
// 32 bf16; B tiles are 16 rows of 16 bf16 pairs (pair = two consecutive k, the even one in the
// low half: the "VNNI" layout TDPBF16PS expects).
#pragma once

#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "cpu/amx.h is for the AMX-enabled (avx512_bf16) variant only"
#endif

#include <immintrin.h>

// GCC 12 reports the _mm512_undefined_*() placeholder inside the AVX-512 intrinsics (masked-off
// merge operand) as maybe-uninitialized wherever they are inlined: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// One bf16 pair (VNNI element): lo in the low half.
TITAN_INLINE uint32_t pack_pair(bf16 lo, bf16 hi) { return uint32_t(lo.bits) | uint32_t(hi.bits) << 16; }

// Every tile register is used whole: 16 rows of 64 bytes. tmm0-3 accumulate, tmm4-7 hold operands.
TITAN_INLINE void amx_configure() {
  struct alignas(64) TileConfig {  // the LDTILECFG memory layout (palette 1)
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
  };
  TileConfig cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) cfg.bytes_per_row[t] = 64, cfg.rows[t] = 16;
  _tile_loadconfig(&cfg);
}

// c[16 rows, 16 j columns) (j < tiles <= 4) = sum over `chunks` k chunks of A tile (a + chunk * a_step,
// row stride a_ld bytes) times B tile j (b + chunk * b_step + j * b_next, stride b_ld bytes);
// steps in bytes. Tile indices must be constants, hence the unrolled cases.
TITAN_INLINE void amx_row_block(float* c, int64_t c_ld, int64_t c_next, const char* a, int64_t a_ld, int64_t a_step,
                                const char* b, int64_t b_ld, int64_t b_step, int64_t b_next, int64_t chunks,
                                int tiles) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < chunks; ++k) {
    const char* bk = b + k * b_step;
    _tile_loadd(4, a + k * a_step, a_ld);
    _tile_loadd(5, bk, b_ld);
    _tile_dpbf16ps(0, 4, 5);
    if (tiles > 1) {
      _tile_loadd(6, bk + b_next, b_ld);
      _tile_dpbf16ps(1, 4, 6);
    }
    if (tiles > 2) {
      _tile_loadd(7, bk + 2 * b_next, b_ld);
      _tile_dpbf16ps(2, 4, 7);
    }
    if (tiles > 3) {
      _tile_loadd(5, bk + 3 * b_next, b_ld);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c, c_ld);
  if (tiles > 1) _tile_stored(1, reinterpret_cast<char*>(c) + c_next, c_ld);
  if (tiles > 2) _tile_stored(2, reinterpret_cast<char*>(c) + 2 * c_next, c_ld);
  if (tiles > 3) _tile_stored(3, reinterpret_cast<char*>(c) + 3 * c_next, c_ld);
}

// amx_row_block with c accumulated into: the C tiles are loaded from c first instead of zeroed
// (c += A x B), so a running f32 sum (flash attention's dq, dk, dv, o) never leaves memory
// between products and needs no vector add pass.
TITAN_INLINE void amx_row_block_acc(float* c, int64_t c_ld, int64_t c_next, const char* a, int64_t a_ld,
                                    int64_t a_step, const char* b, int64_t b_ld, int64_t b_step, int64_t b_next,
                                    int64_t chunks, int tiles) {
  char* cb = reinterpret_cast<char*>(c);
  _tile_loadd(0, cb, c_ld);
  if (tiles > 1) _tile_loadd(1, cb + c_next, c_ld);
  if (tiles > 2) _tile_loadd(2, cb + 2 * c_next, c_ld);
  if (tiles > 3) _tile_loadd(3, cb + 3 * c_next, c_ld);
  for (int64_t k = 0; k < chunks; ++k) {
    const char* bk = b + k * b_step;
    _tile_loadd(4, a + k * a_step, a_ld);
    _tile_loadd(5, bk, b_ld);
    _tile_dpbf16ps(0, 4, 5);
    if (tiles > 1) {
      _tile_loadd(6, bk + b_next, b_ld);
      _tile_dpbf16ps(1, 4, 6);
    }
    if (tiles > 2) {
      _tile_loadd(7, bk + 2 * b_next, b_ld);
      _tile_dpbf16ps(2, 4, 7);
    }
    if (tiles > 3) {
      _tile_loadd(5, bk + 3 * b_next, b_ld);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, cb, c_ld);
  if (tiles > 1) _tile_stored(1, cb + c_next, c_ld);
  if (tiles > 2) _tile_stored(2, cb + 2 * c_next, c_ld);
  if (tiles > 3) _tile_stored(3, cb + 3 * c_next, c_ld);
}

// 2^x on 16 floats for the softmax probabilities that AMX consumes as bf16 operands: x rounded
// to the nearest integer n, 2^(x - n) by its degree-5 Taylor polynomial on [-1/2, 1/2] (relative
// error below 3e-6, far under bf16's 2^-9 rounding), scaled by 2^n with VSCALEFPS. About half the
// instructions of fast_exp's clamp, range reduction and exponent assembly; the softmax vector
// work, not the tile products, bounds flash attention on AMX. x is clamped below at -125 (result
// about 2^-125, never a subnormal: callers zero masked entries themselves); -inf and NaN give that
// too. Exact powers of two up to x = 127; attention passes scores minus their lse or minus a
// running max they exceed by at most a few units.
TITAN_INLINE __m512 exp2_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);  // ln2^k / k!, k = 5 .. 1
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

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

// One VNNI row of a bf16 pair of rows (the B layout of AMX's bf16 product): dst[col] holds
// v0[col] in its low and v1[col] in its high half; v1 null (the last, unpaired key) gives zeros.
TITAN_INLINE void pack_row_pair(uint32_t* dst, const bf16* v0, const bf16* v1, int64_t width) {
  if (!v1) {
#pragma omp simd
    for (int64_t col = 0; col < width; ++col) dst[col] = uint32_t(v0[col].bits);
    return;
  }
#pragma omp simd
  for (int64_t col = 0; col < width; ++col) dst[col] = uint32_t(v0[col].bits) | uint32_t(v1[col].bits) << 16;
}

// c [Hs, wp] f32 = a [Hs, K2] (bf16 pairs along the key dim) x b [K2, wp] (VNNI rows of key
// pairs), on AMX in 16-row, 64-column blocks: the heads-times-selected-rows product of the
// forward's output (P x V) and of the backward's dq (dS x K). Hs and wp are multiples of 16;
// n2p (key pairs, a multiple of 16) bounds the sum.
TITAN_INLINE void amx_heads_times_rows(float* c, const uint32_t* a, int64_t k2, const uint32_t* b, int64_t hs,
                                       int64_t wp, int64_t n2p) {
  for (int64_t h0 = 0; h0 < hs; h0 += 16) {
    for (int64_t c0 = 0; c0 < wp; c0 += 64) {
      const int tiles = int((wp - c0) / 16 < 4 ? (wp - c0) / 16 : 4);
      amx_row_block(c + h0 * wp + c0, wp * 4, 64, reinterpret_cast<const char*>(a + h0 * k2), k2 * 4, 64,
                    reinterpret_cast<const char*>(b + c0), wp * 4, 16 * wp * 4, 64, n2p / 16, tiles);
    }
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
