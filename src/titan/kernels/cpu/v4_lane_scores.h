// DeepSeek-V4 attention's CSA entries read in place (AVX-512, f32 rows, few heads): the products
// of one query's heads with its selected entry rows, without gathering the rows into a buffer.
// Included only inside `#if defined(TITAN_AVX512_ROWS)` (cpu/avx512.h's variant).
//
// With H < 16 heads the scores of one key fill H of a vector's 16 lanes. Here the lanes are split
// into H groups of e = 16 / H: lane h e + i of a key's accumulator sums q[h][v e + i] row[v e + i]
// over v, with the row's e floats at v e broadcast to every group, so every lane does useful work
// and the row is read straight from comp (a gathered, transposed copy cost more than the products
// at 4 heads). A short reduction within each group then gives the key's H scores.
#pragma once

#include <cstdint>
#include <cstring>

#include "titan/kernels/cpu/avx512.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// Whether the lane-group path serves H heads of D dims: H divides 16 (H < 16) and D splits into
// whole groups of e = 16 / H.
TITAN_INLINE bool lane_groups_fit(int64_t H, int64_t D) { return H < 16 && 16 % H == 0 && D % (16 / H) == 0; }

// qq [D / e, 16]: lane h e + i of vector v = column col0 + h of the transposed rows qt [D, ldq] at
// row v e + i (the query's head h, dim v e + i).
inline void pack_lane_q(float* qq, const float* qt, int64_t ldq, int64_t col0, int64_t H, int64_t D) {
  const int64_t e = 16 / H;
  for (int64_t v = 0; v < D / e; ++v) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < e; ++i) qq[v * 16 + h * e + i] = qt[(v * e + i) * ldq + col0 + h];
    }
  }
}

// The e floats at p in every group of e lanes.
template <int E>
TITAN_INLINE __m512 broadcast_group(const float* p) {
  if constexpr (E == 2) {
    double x;
    std::memcpy(&x, p, sizeof x);
    return _mm512_castpd_ps(_mm512_set1_pd(x));
  } else if constexpr (E == 4) {
    return _mm512_broadcast_f32x4(_mm_loadu_ps(p));
  } else if constexpr (E == 8) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
  } else {
    return _mm512_loadu_ps(p);
  }
}

// Every lane of a group of E lanes = the group's sum. (The all-lanes masked forms: the plain
// permute and shuffle pass GCC 12 an undefined vector, which it warns about.)
template <int E>
TITAN_INLINE __m512 sum_groups(__m512 x) {
  constexpr __mmask16 all = 0xFFFF;
  if constexpr (E >= 2) x = _mm512_add_ps(x, _mm512_mask_permute_ps(x, all, x, 0xB1));           // neighbours
  if constexpr (E >= 4) x = _mm512_add_ps(x, _mm512_mask_permute_ps(x, all, x, 0x4E));           // pairs
  if constexpr (E >= 8) x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, all, x, x, 0xB1));     // 128-bit halves
  if constexpr (E >= 16) x = _mm512_add_ps(x, _mm512_mask_shuffle_f32x4(x, all, x, x, 0x4E));    // 256-bit halves
  return x;
}

// s [H, ld] columns j0 .. j0 + 15 = the scores of rows[j0 .. j0 + 16) against the heads packed in
// qq (pack_lane_q, nv = D / E vectors).
template <int E>
void lane_scores_16(float* s, int64_t ld, const float* qq, int64_t nv, const float* const* rows, int64_t j0) {
  constexpr int H = 16 / E;
  __m512 acc[16];
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t v = 0; v < nv; ++v) {
    const __m512 qv = _mm512_loadu_ps(qq + v * 16);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(qv, broadcast_group<E>(rows[j0 + k] + v * E), acc[k]);
  }
  // E keys per vector: lane h E + i holds key k0 + i's score of head h.
  alignas(64) float lanes_out[16];
#pragma GCC unroll 16
  for (int k0 = 0; k0 < 16; k0 += E) {
    __m512 r = sum_groups<E>(acc[k0]);
#pragma GCC unroll 16
    for (int i = 1; i < E; ++i) {
      __mmask16 mask = 0;
      for (int h = 0; h < H; ++h) mask = __mmask16(mask | (1u << (h * E + i)));
      r = _mm512_mask_blend_ps(mask, r, sum_groups<E>(acc[k0 + i]));
    }
    _mm512_store_ps(lanes_out, r);
    for (int h = 0; h < H; ++h) std::memcpy(s + h * ld + j0 + k0, lanes_out + h * E, sizeof(float) * E);
  }
}

// s [H, ld] columns 0 .. n16 - 1 (n16 a multiple of 16; rows[j] for every j < n16) = the scores
// of the rows against the heads packed in qq (pack_lane_q for H heads of D dims).
inline void lane_scores(float* s, int64_t ld, const float* qq, int64_t H, int64_t D, const float* const* rows,
                        int64_t n16) {
  const int64_t nv = D / (16 / H);
  for (int64_t j0 = 0; j0 < n16; j0 += 16) {
    switch (H) {
      case 1: lane_scores_16<16>(s, ld, qq, nv, rows, j0); break;
      case 2: lane_scores_16<8>(s, ld, qq, nv, rows, j0); break;
      case 4: lane_scores_16<4>(s, ld, qq, nv, rows, j0); break;
      default: lane_scores_16<2>(s, ld, qq, nv, rows, j0); break;
    }
  }
}

// out rows h0 .. h0 + HH (ldo apart) columns d0 .. d0 + 64 (those < D) += p [HH, n] (rows ldp
// apart) x rows[j][d0 ..].
template <int HH>
void rows_product_tile(float* out, int64_t ldo, const float* p, int64_t ldp, const float* const* rows, int64_t n,
                       int64_t d0, int64_t D) {
  __mmask16 mask[4];
  __m512 acc[HH][4];
#pragma GCC unroll 4
  for (int v = 0; v < 4; ++v) mask[v] = lanes(D - d0 - 16 * v > 0 ? D - d0 - 16 * v : 0);
#pragma GCC unroll 4
  for (int h = 0; h < HH; ++h) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) acc[h][v] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    __m512 r[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) r[v] = _mm512_maskz_loadu_ps(mask[v], rows[j] + d0 + 16 * v);
#pragma GCC unroll 4
    for (int h = 0; h < HH; ++h) {
      const __m512 ph = _mm512_set1_ps(p[h * ldp + j]);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) acc[h][v] = _mm512_fmadd_ps(ph, r[v], acc[h][v]);
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < HH; ++h) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      float* dst = out + h * ldo + d0 + 16 * v;
      _mm512_mask_storeu_ps(dst, mask[v], _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], dst), acc[h][v]));
    }
  }
}

// out [H, D] (rows ldo apart) += p [H, n] (rows ldp apart) x rows[0 .. n) (D floats each).
inline void rows_product(float* out, int64_t ldo, const float* p, int64_t ldp, int64_t H, const float* const* rows,
                         int64_t n, int64_t D) {
  for (int64_t h0 = 0; h0 < H; h0 += 4) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      float* o = out + h0 * ldo;
      const float* ph = p + h0 * ldp;
      switch (H - h0 >= 4 ? 4 : H - h0) {
        case 1: rows_product_tile<1>(o, ldo, ph, ldp, rows, n, d0, D); break;
        case 2: rows_product_tile<2>(o, ldo, ph, ldp, rows, n, d0, D); break;
        case 3: rows_product_tile<3>(o, ldo, ph, ldp, rows, n, d0, D); break;
        default: rows_product_tile<4>(o, ldo, ph, ldp, rows, n, d0, D); break;
      }
    }
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
