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

#include "titan/kernels/cpu/isa.h"
// After isa.h, which defines TITAN_AVX512_ROWS: the AMX variant is also the AVX-512 rows variant.
#include "titan/kernels/cpu/avx512.h"

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
// steps in bytes. Tile indices must be constants, hence the unrolled cases. With kAccumulate the
// C tiles are loaded from c first instead of zeroed (c += A x B), so a running f32 sum (flash
// attention's dq, dk, dv, o) never leaves memory between products and needs no vector add pass.
template <bool kAccumulate = false>
TITAN_INLINE void amx_row_block(float* c, int64_t c_ld, int64_t c_next, const char* a, int64_t a_ld, int64_t a_step,
                                const char* b, int64_t b_ld, int64_t b_step, int64_t b_next, int64_t chunks,
                                int tiles) {
  char* cb = reinterpret_cast<char*>(c);
  if constexpr (kAccumulate) {
    _tile_loadd(0, cb, c_ld);
    if (tiles > 1) _tile_loadd(1, cb + c_next, c_ld);
    if (tiles > 2) _tile_loadd(2, cb + 2 * c_next, c_ld);
    if (tiles > 3) _tile_loadd(3, cb + 3 * c_next, c_ld);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
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

// c[16 b rows, 16 columns) for b < blocks <= 4 (row blocks c_down bytes apart) = sum over `chunks`
// k chunks of A tile b (a + b * a_down + chunk * a_step, row stride a_ld bytes) times one B tile
// (b + chunk * b_step, stride b_ld): the same B tile feeds up to four accumulators, so a product
// with one output column tile (e.g. the scores of 16 heads) still has four independent
// TDPBF16PS chains instead of one latency-bound chain.
TITAN_INLINE void amx_col_block(float* c, int64_t c_ld, int64_t c_down, const char* a, int64_t a_ld, int64_t a_step,
                                int64_t a_down, const char* b, int64_t b_ld, int64_t b_step, int64_t chunks,
                                int blocks) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < chunks; ++k) {
    const char* ak = a + k * a_step;
    _tile_loadd(4, b + k * b_step, b_ld);
    _tile_loadd(5, ak, a_ld);
    _tile_dpbf16ps(0, 5, 4);
    if (blocks > 1) {
      _tile_loadd(6, ak + a_down, a_ld);
      _tile_dpbf16ps(1, 6, 4);
    }
    if (blocks > 2) {
      _tile_loadd(7, ak + 2 * a_down, a_ld);
      _tile_dpbf16ps(2, 7, 4);
    }
    if (blocks > 3) {
      _tile_loadd(5, ak + 3 * a_down, a_ld);
      _tile_dpbf16ps(3, 5, 4);
    }
  }
  char* cb = reinterpret_cast<char*>(c);
  _tile_stored(0, cb, c_ld);
  if (blocks > 1) _tile_stored(1, cb + c_down, c_ld);
  if (blocks > 2) _tile_stored(2, cb + 2 * c_down, c_ld);
  if (blocks > 3) _tile_stored(3, cb + 3 * c_down, c_ld);
}

// c[16 rows of block r, 16 columns of tile j) for r, j < 2 (row blocks c_down bytes apart, column
// tiles 64 bytes apart) = sum over `chunks` k chunks of A tile r (a + r * a_down + chunk * a_step,
// row stride a_ld bytes) times B tile j (b + chunk * b_step + j * 64, stride b_ld): for a product
// two column tiles wide, each A and each B tile is loaded once per chunk for two products, and
// the four accumulators are four independent chains. Tile loads, stores and products do not
// overlap on the Sapphire-Rapids-class CPU this was measured on (a load costs about half a
// product, a store about one), so one load per product instead of 1x4's 1.25 is worth ~10%.
// With kAccumulate the C tiles are loaded from c first (c += A x B), as in amx_row_block.
template <bool kAccumulate = false>
TITAN_INLINE void amx_block_2x2(float* c, int64_t c_ld, int64_t c_down, const char* a, int64_t a_ld, int64_t a_step,
                                int64_t a_down, const char* b, int64_t b_ld, int64_t b_step, int64_t chunks) {
  char* cb = reinterpret_cast<char*>(c);
  if constexpr (kAccumulate) {
    _tile_loadd(0, cb, c_ld);
    _tile_loadd(1, cb + 64, c_ld);
    _tile_loadd(2, cb + c_down, c_ld);
    _tile_loadd(3, cb + c_down + 64, c_ld);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < chunks; ++k) {
    _tile_loadd(4, a + k * a_step, a_ld);
    _tile_loadd(6, b + k * b_step, b_ld);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + k * b_step + 64, b_ld);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + a_down + k * a_step, a_ld);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, cb, c_ld);
  _tile_stored(1, cb + 64, c_ld);
  _tile_stored(2, cb + c_down, c_ld);
  _tile_stored(3, cb + c_down + 64, c_ld);
}

// One VNNI row of a bf16 pair of rows (the B layout of AMX's bf16 product): dst[col] holds
// v0[col] in its low and v1[col] in its high half; v1 null (the last, unpaired key) gives zeros.
TITAN_INLINE void pack_row_pair(uint32_t* dst, const bf16* v0, const bf16* v1, int64_t width) {
  if (v1 && width % 32 == 0) {  // 32 columns per two 2-source word permutes
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                        37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (int64_t col = 0; col < width; col += 32) {
      const __m512i a = _mm512_loadu_si512(v0 + col), b = _mm512_loadu_si512(v1 + col);
      _mm512_storeu_si512(dst + col, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + col + 16, _mm512_permutex2var_epi16(a, hi, b));
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

// c [Hs, wp] f32 = a [Hs, K2] (bf16 pairs along the key dim) x b [K2, wp] (VNNI rows of key
// pairs), on AMX: the heads-times-selected-rows product of the forward's output (P x V) and of
// the backward's dq (dS x K). One head block: 16-row, 64-column blocks (one A tile, four B
// tiles); more: each B tile, the operand that streams, is loaded once for up to four head blocks.
// Hs and wp are multiples of 16; n2p (key pairs, a multiple of 16) bounds the sum.
TITAN_INLINE void amx_heads_times_rows(float* c, const uint32_t* a, int64_t k2, const uint32_t* b, int64_t hs,
                                       int64_t wp, int64_t n2p) {
  if (hs >= 32) {  // several head blocks: each B tile (streamed from L2) feeds up to four of them
    for (int64_t c0 = 0; c0 < wp; c0 += 16) {
      for (int64_t h0 = 0; h0 < hs; h0 += 64) {
        const int blocks = int((hs - h0) / 16 < 4 ? (hs - h0) / 16 : 4);
        amx_col_block(c + h0 * wp + c0, wp * 4, 16 * wp * 4, reinterpret_cast<const char*>(a + h0 * k2), k2 * 4, 64,
                      16 * k2 * 4, reinterpret_cast<const char*>(b + c0), wp * 4, 16 * wp * 4, n2p / 16, blocks);
      }
    }
    return;
  }
  for (int64_t h0 = 0; h0 < hs; h0 += 16) {
    for (int64_t c0 = 0; c0 < wp; c0 += 64) {
      const int tiles = int((wp - c0) / 16 < 4 ? (wp - c0) / 16 : 4);
      amx_row_block(c + h0 * wp + c0, wp * 4, 64, reinterpret_cast<const char*>(a + h0 * k2), k2 * 4, 64,
                    reinterpret_cast<const char*>(b + c0), wp * 4, 16 * wp * 4, 64, n2p / 16, tiles);
    }
  }
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
