// The register-tiled micro-GEMM of kernels/cpu/ (per-ISA namespace, as cpu/isa.h requires): one
// family of small f32-accumulating products over packed, zero-padded buffers, shared by flash
// attention, the lightning indexer and sparse MLA, each with its own tiling (a Tiles struct; see
// TileDefaults).
//
//   C[M, N] (op)= A(M x K) B[K, N],  A(r, k) = a[r * a_row + k * a_k],  B rows ldb elements apart
//
// A may be read transposed (a_row = 1), so P^T or dS^T need no transposed copy. N is a multiple of
// kVecLanes (B and C are padded to whole vectors). E is the element of A and B: float (f32 FMA)
// or, in the avx512_bf16 variant, uint32_t bf16 pairs with K counting pairs (VDPBF16PS against B
// rows of 16 pairs: the VNNI layout of cpu/bf16_pairs.h). Each C element sums its products in k
// order in one f32 register; chunking the depth stores and reloads that sum exactly, so blocking
// never changes results.
#pragma once

#include <cstdint>
#include <type_traits>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// The tiling of one kernel family's products: a struct deriving from TileDefaults that sets
//   kRows, kVecs: Rows x Vecs accumulators, plus Vecs loaded B vectors and one broadcast, fill the
//     register file (32 zmm with AVX-512, 16 ymm or xmm otherwise);
//   kNarrowRows: the rows of a strip one vector wide, enough independent FMA chains to cover the
//     FMA latency;
// and where it differs from the defaults
//   kDepth: k steps per pass of gemm() over C (the B strip of a pass stays in L1 while every row
//     tile runs over it);
//   kPrefetch: gemm() requests the next pass's B rows (or the caller's next operand) while a pass
//     runs, one cache line per k step of the first strip (a burst would stall on the fill buffers);
//   kRowTails: false when every M is a whole number of row tiles (the caller pads its rows), so no
//     shorter tiles are compiled.
// kWholeDepth: a depth no product reaches (gemm() then makes one pass).
inline constexpr int64_t kWholeDepth = int64_t(1) << 40;
struct TileDefaults {
  static constexpr int64_t kDepth = kWholeDepth;
  static constexpr bool kPrefetch = false, kRowTails = true;
};

// How a tile's sums reach C.
enum class TileStore {
  write,       // C = A B (C is not read)
  accumulate,  // C += A B, the sums starting from C's values: one rounding per product
  add,         // C = C + A B, the products summed from 0 and added after the k loop: C is read
               // only at the end (scattered rows far larger than L2: see gemm_add_rows)
};

// C rows: dense (c + r * ld) or given by pointer (col floats into rows[r]).
struct StridedRows {
  float* c;
  int64_t ld;
  TITAN_INLINE float* row(int64_t r) const { return c + r * ld; }
  TITAN_INLINE StridedRows at(int64_t r, int64_t col) const { return {c + r * ld + col, ld}; }
};
struct PointedRows {
  float* const* rows;
  int64_t col;
  TITAN_INLINE float* row(int64_t r) const { return rows[r] + col; }
  TITAN_INLINE PointedRows at(int64_t r, int64_t c) const { return {rows + r, col + c}; }
};

// acc[v] += a * b[v] for v < Vecs: one step of a tile's products. E = float: a broadcast and f32
// FMA. E = uint32_t (avx512_bf16 only): a is a bf16 pair, broadcast into VDPBF16PS against the
// 16 bf16 pairs of each b[v].
template <int Vecs, class E>
TITAN_INLINE void madd_broadcast(vecf* acc, E a, const vecf* b) {
  if constexpr (std::is_same_v<E, float>) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[v] += a * b[v];
  } else {
#if defined(__AVX512BF16__)
    const __m512bh pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(a)));
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[v] = _mm512_dpbf16_ps(acc[v], pair, reinterpret_cast<__m512bh>(b[v]));
#else
    static_assert(sizeof(E) == 0, "bf16 pair products need the avx512_bf16 variant");
#endif
  }
}

// acc[r][v] += sum over k < K of A(r, k) times the vector b + k * ldb + v * kVecLanes, for r < Rows,
// v < Vecs. With kPrefetch, k step kk < pf_lines requests the cache line pf + 64 kk.
template <int Rows, int Vecs, bool kPrefetch = false, class E>
TITAN_INLINE void tile_madd(vecf (&acc)[Rows][Vecs], const E* a, int64_t a_row, int64_t a_k, const E* b, int64_t ldb,
                            int64_t K, const char* pf = nullptr, int64_t pf_lines = 0) {
  // Scalar math: acc[r][v] += A(r, kk) * B[kk][v] (a pair's two products, summed, for bf16 pairs)
  // Two k steps per iteration: the pointer updates and the loop branch spread over twice the FMAs.
#pragma GCC unroll 2
  for (int64_t kk = 0; kk < K; ++kk) {
    vecf bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) bv[v] = *reinterpret_cast<const vecf*>(b + kk * ldb + v * kVecLanes);
    if constexpr (kPrefetch) {
      if (kk < pf_lines) __builtin_prefetch(pf + kk * 64);
    }
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) madd_broadcast<Vecs>(acc[r], a[r * a_row + kk * a_k], bv);
  }
}

// acc = the tile's products alone, for a caller's own epilogue (the indexer's fused head scores).
template <int Rows, int Vecs, class E>
TITAN_INLINE void tile_products(vecf (&acc)[Rows][Vecs], const E* a, int64_t a_row, int64_t a_k, const E* b,
                                int64_t ldb, int64_t K) {
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = vecf{};
  }
  tile_madd(acc, a, a_row, a_k, b, ldb, K);
}

// One Rows x (Vecs vectors) tile of C, its sums in registers for the whole k loop.
template <int Rows, int Vecs, TileStore kStore, bool kPrefetch = false, class E, class CRows>
TITAN_INLINE void gemm_tile(CRows c, const E* a, int64_t a_row, int64_t a_k, const E* b, int64_t ldb, int64_t K,
                            const char* pf = nullptr, int64_t pf_lines = 0) {
  vecf acc[Rows][Vecs];
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      acc[r][v] = kStore == TileStore::accumulate ? loadv(c.row(r) + v * kVecLanes) : vecf{};
    }
  }
  tile_madd<Rows, Vecs, kPrefetch>(acc, a, a_row, a_k, b, ldb, K, pf, pf_lines);
  // Scalar math: C[r][v] = (add ? C[r][v] : 0) + acc[r][v]
#pragma GCC unroll 16
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      float* dst = c.row(r) + v * kVecLanes;
      storev(dst, kStore == TileStore::add ? loadv(dst) + acc[r][v] : acc[r][v]);
    }
  }
}

// gemm_tile for the last rows (< Rows, at run time) of a column strip.
template <int Rows, int Vecs, TileStore kStore, class E, class CRows>
TITAN_INLINE void gemm_row_tail(int64_t rows, CRows c, const E* a, int64_t a_row, int64_t a_k, const E* b,
                                int64_t ldb, int64_t K) {
  if (rows == Rows) {
    gemm_tile<Rows, Vecs, kStore>(c, a, a_row, a_k, b, ldb, K);
  } else if constexpr (Rows > 1) {
    gemm_row_tail<Rows - 1, Vecs, kStore>(rows, c, a, a_row, a_k, b, ldb, K);
  }
}

// One tile of rows <= Cfg::kRows (exactly Cfg::kRows unless Cfg::kRowTails) by vecs <= Vecs
// vectors, both known at run time only.
template <class Cfg, int Vecs, TileStore kStore, class E, class CRows>
TITAN_INLINE void gemm_tile_tail(int64_t vecs, int64_t rows, CRows c, const E* a, int64_t a_row, int64_t a_k,
                                 const E* b, int64_t ldb, int64_t K) {
  if (vecs == Vecs) {
    if constexpr (Cfg::kRowTails) {
      gemm_row_tail<Cfg::kRows, Vecs, kStore>(rows, c, a, a_row, a_k, b, ldb, K);
    } else {
      gemm_tile<Cfg::kRows, Vecs, kStore>(c, a, a_row, a_k, b, ldb, K);
    }
  } else if constexpr (Vecs > 1) {
    gemm_tile_tail<Cfg, Vecs - 1, kStore>(vecs, rows, c, a, a_row, a_k, b, ldb, K);
  }
}

// All M rows of one column strip of vecs (<= Vecs) vectors: whole row tiles, then a shorter one
// (unless Cfg::kRowTails is false).
// With Cfg::kPrefetch, the pf_lines cache lines at pf are requested spread over the row tiles, so
// that their transfer overlaps this strip's FMAs.
template <class Cfg, int Vecs, TileStore kStore, class E, class CRows>
void gemm_strip(int64_t vecs, CRows c, const E* a, int64_t a_row, int64_t a_k, const E* b, int64_t ldb, int64_t M,
                int64_t K, const char* pf, int64_t pf_lines) {
  if (vecs != Vecs) {
    if constexpr (Vecs > 1) gemm_strip<Cfg, Vecs - 1, kStore>(vecs, c, a, a_row, a_k, b, ldb, M, K, pf, pf_lines);
    return;
  }
  constexpr int rows = Vecs == 1 ? Cfg::kNarrowRows : Cfg::kRows;
  int64_t m = 0;
  if constexpr (Cfg::kPrefetch) {
    const int64_t tiles = M / rows, per_tile = tiles > 0 ? (pf_lines + tiles - 1) / tiles : 0;
    for (int64_t line = 0; m + rows <= M; m += rows, line += per_tile) {
      gemm_tile<rows, Vecs, kStore, true>(c.at(m, 0), a + m * a_row, a_row, a_k, b, ldb, K, pf + line * 64,
                                          min_i64(per_tile, pf_lines - line));
    }
  } else {
    for (; m + rows <= M; m += rows) gemm_tile<rows, Vecs, kStore>(c.at(m, 0), a + m * a_row, a_row, a_k, b, ldb, K);
  }
  if constexpr (Cfg::kRowTails) {
    if (m < M) gemm_row_tail<rows, Vecs, kStore>(M - m, c.at(m, 0), a + m * a_row, a_row, a_k, b, ldb, K);
  }
}

// C[M, N] (op)= A(M x K) B[K, N] for dense C (rows ldc apart): passes of Cfg::kDepth k steps, each
// over every column strip (Cfg::kVecs vectors wide) and every row tile. The passes after the
// first accumulate. With Cfg::kPrefetch, each pass requests the next pass's B rows (when B is
// contiguous, ldb == N) or, for the last pass, next_floats floats at `next` (the caller's next
// operand). K == 0 with kStore == write still writes C (zeros).
template <class Cfg, TileStore kStore, class E>
void gemm(float* c, int64_t ldc, const E* a, int64_t a_row, int64_t a_k, const E* b, int64_t ldb, int64_t M,
          int64_t N, int64_t K, const float* next = nullptr, int64_t next_floats = 0) {
  static_assert(kStore != TileStore::add, "gemm accumulates in C's registers; gemm_add_rows adds");
  int64_t k0 = 0;
  do {
    const int64_t kc = min_i64(Cfg::kDepth, K - k0);
    const char* pf = nullptr;
    int64_t pf_lines = 0;
    if constexpr (Cfg::kPrefetch) {
      const bool more = k0 + Cfg::kDepth < K && ldb == N;
      pf = more ? reinterpret_cast<const char*>(b + (k0 + Cfg::kDepth) * ldb) : reinterpret_cast<const char*>(next);
      pf_lines = (more ? min_i64(Cfg::kDepth, K - k0 - Cfg::kDepth) * ldb : next_floats) * 4 / 64;
    }
    for (int64_t n = 0; n < N; n += Cfg::kVecs * kVecLanes) {
      const int64_t vecs = min_i64((N - n) / kVecLanes, Cfg::kVecs);
      const int64_t lines = n == 0 ? pf_lines : 0;  // the first strip requests them all
      const StridedRows cn{c + n, ldc};
      if (kStore == TileStore::accumulate || k0 > 0) {
        gemm_strip<Cfg, Cfg::kVecs, TileStore::accumulate>(vecs, cn, a + k0 * a_k, a_row, a_k, b + k0 * ldb + n, ldb,
                                                           M, kc, pf, lines);
      } else {
        gemm_strip<Cfg, Cfg::kVecs, TileStore::write>(vecs, cn, a, a_row, a_k, b + n, ldb, M, kc, pf, lines);
      }
    }
    k0 += Cfg::kDepth;
  } while (k0 < K);
}

// C[rows[r]] = C[rows[r]] + A(M x K) B[K, N] for r < M (a multiple of Cfg::kRows), C rows given by
// pointer (scattered rows of a buffer far larger than L2, e.g. sparse MLA's dkv of the selected
// keys). Row tiles outermost, each walking its rows left to right, and every strip step
// prefetches the same strip of the next row tile's rows, a whole row tile (all of B) ahead: a
// tile touches its C rows only after its k loop, too late for out-of-order execution to hide the
// misses (they were half the time of the dkv product). Depth is not chunked.
template <class Cfg, class E>
void gemm_add_rows(float* const* rows, const E* a, int64_t a_row, int64_t a_k, const E* b, int64_t ldb, int64_t M,
                   int64_t N, int64_t K) {
  for (int64_t r = 0; r < M; r += Cfg::kRows) {
    for (int64_t col = 0; col < N; col += Cfg::kVecs * kVecLanes) {
      const int64_t vecs = min_i64((N - col) / kVecLanes, Cfg::kVecs);
      for (int64_t rr = r + Cfg::kRows; rr < r + 2 * Cfg::kRows && rr < M; ++rr) {
        for (int64_t e = 0; e < vecs * kVecLanes; e += 16) __builtin_prefetch(rows[rr] + col + e, 1, 3);
      }
      gemm_tile_tail<Cfg, Cfg::kVecs, TileStore::add>(vecs, Cfg::kRows, PointedRows{rows + r, col}, a + r * a_row,
                                                      a_row, a_k, b + col, ldb, K);
    }
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
