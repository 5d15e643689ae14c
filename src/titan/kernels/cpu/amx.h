// AMX bf16 tile helpers shared by the kernels in kernels/cpu/ (sparse MLA, attention, ...).
// Included only inside `#if defined(__AMX_TILE__) && defined(__AMX_BF16__)`, i.e. in the
// avx512_bf16 variant; callers also check cpu_amx_bf16_usable() at run time and call
// amx_configure() on each thread before the first tile instruction (and _tile_release() after).
//
// TDPBF16PS runs 16 x 16 f32 tile products on bf16 operands, which the vector units (f32 FMA, or
// VDPBF16PS at about the same rate on the Sapphire-Rapids-class CPU measured) cannot approach.
// Operand layouts: A tiles are 16 rows of 32 bf16; B tiles are 16 rows of 16 bf16 pairs (pair =
// two consecutive k, the even one in the low half: the "VNNI" layout TDPBF16PS expects). The
// pair packing helpers are in cpu/bf16_pairs.h, shared with the VDPBF16PS kernels.
#pragma once

#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "cpu/amx.h is for the AMX-enabled (avx512_bf16) variant only"
#endif

#include <immintrin.h>

#include "titan/kernels/cpu/bf16_pairs.h"

namespace titan::kernels::cpu::TITAN_ISA {

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

}  // namespace titan::kernels::cpu::TITAN_ISA
