// Lightning indexer on the CPU. Queries are processed in blocks that stay resident while key
// blocks of kKeys keys stream past; the head dot products of a (query block, key block) pair are
// one small register-tiled GEMM (cpu/tile_gemm.h) over packed, zero-padded buffers, and the
// S x Skv score matrix never exists (only kKeys-wide tiles of it). The top-k on AVX-512 (without AMX) goes further:
// each query's scores over a key block come from its head rows four heads at a time with the
// head dots in registers (fused_scores), so not even the block's [heads, kKeys] dots are stored.
// * top-k: each query row keeps a buffer of up to 4K + kKeys candidates as sortable 64-bit keys
//   (score rank << 32 | ~index, so ties rank the lower index first and a plain integer compare
//   orders them); keys at or below the row's admission floor are not appended (AVX-512: eight at
//   a time with a compress). When the buffer fills, a sampled estimate raises the floor and drops
//   the keys under it (compact_candidates); a quickselect picks the final K.
// * KL loss, blocked path: two passes per query block (the lse of I, then target, loss and
//   gradients per key block), over every causal key (dense stage, target recomputed from the
//   main attention) or masked to the selections (sparse-stage blocks whose selections cover at
//   least half of their causal keys; the given per-slot target scattered to key columns).
//   Gathered path (the other sparse blocks): one query row at a time, its selected keys and
//   their targets gathered into contiguous per-thread buffers. The sparse stage takes its target
//   from the sparse attention's forward (sparse_mla_forward's head_mean), which has the
//   probabilities at hand: recomputing them here cost 2 H Dqk FLOPs and a Dqk-wide row gather
//   per selected pair, about 12x the indexer's own work at H = 16, Dqk = 576, HI = 4, DI = 64.
//   dk accumulates in per-thread f32 buffers that are summed at
//   the end (no races, deterministic for a fixed thread count).
// bf16 in the avx512_bf16 variant: the top-k dot products and the dense KL stage's products (the
// indexer dots and the target's tau mq mk^T) take bf16 pair operands with f32 accumulation, on
// AMX tiles when cpu_amx_bf16_usable(), else by VDPBF16PS in the register tiles of
// cpu/tile_gemm.h; the blocked path's gradient products (G k, G^T q) stay f32 FMA. The sparse stage's
// narrow gathered rows (<= 4 heads of 16-64 dims) read the bf16 keys in place: dots, and with
// 32-dim chunks the gradient products too (G rounded to bf16), on VDPBF16PS. Elsewhere (and at
// the lower ISA levels) bf16 inputs are widened to f32 while packing (O(S D) work against
// O(S Skv D) products).
// std:: algorithms are not used: templates from shared headers would be instantiated with this
// file's ISA flags and might be picked by the linker for other ISA levels (see cpu/isa.h).
#include "titan/kernels/cpu/lightning_indexer.h"

#include <omp.h>

#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "titan/kernels/cpu/amx.h"
#endif

#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/cpu/tile_gemm.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Keys per streamed block: the width of every score tile.
constexpr int64_t kKeys = 64;
// Top-k query-block height in GEMM rows (queries x indexer heads): a 64 x 64 tile is 16 KiB.
constexpr int64_t kTargetRows = 64;
// KL loss query blocks: up to kDenseQueries queries and kMaxDenseRows (queries x heads).
constexpr int64_t kDenseQueries = 64, kMaxDenseRows = 1024;
// The products' register tiles (cpu/tile_gemm.h): 6 x 4 vectors with AVX-512; a strip one vector
// wide (a wide gathered row's 16 heads) takes 12 rows. Passes of 64 k steps, each prefetching
// the next: each B strip pass (64 x 64 floats, 16 KiB) stays in L1 while all M rows run over it
// (a whole strip of the dense target, D = 192, 48 KiB, did not, and every tile re-read it from
// L2), and the first tile over a pass fetched it from L3 or memory at a bandwidth far below the
// FMA rate.
struct Tiles : TileDefaults {
#if defined(__AVX512F__)
  static constexpr int kRows = 6, kVecs = 4, kNarrowRows = 12;
#elif defined(__AVX2__)
  static constexpr int kRows = 6, kVecs = 2, kNarrowRows = 12;
#else
  static constexpr int kRows = 4, kVecs = 2, kNarrowRows = 8;
#endif
  static constexpr int64_t kDepth = 64;
  static constexpr bool kPrefetch = true;
};
constexpr int64_t kTileVecs = kKeys / kVecLanes;  // vectors per kKeys-wide tile row

TITAN_INLINE uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }
TITAN_INLINE vecf relu(vecf x) { return x > splat(0.0f) ? x : splat(0.0f); }

// ---- packing --------------------------------------------------------------------------------
// dst[j][c] = src[j][c] as f32 for j < rows, c < width; zero for c in [width, ld_dst).
template <class T>
void pack_rows(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t width) {
  for (int64_t j = 0; j < rows; ++j) {
    const T* in = src + j * ld_src;
    float* out = dst + j * ld_dst;
    // Scalar math: out = in, as f32
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) out[c] = to_f32(in[c]);
    for (int64_t c = width; c < ld_dst; ++c) out[c] = 0.0f;
  }
}

// dst[c][j] = src[j][c] for c < width, j < kKeys (a key block transposed: keys become columns);
// columns j >= rows are zero.
template <class T>
void pack_transposed(float* dst, const T* src, int64_t ld_src, int64_t rows, int64_t width) {
  for (int64_t c = 0; c < width; ++c) {
    float* out = dst + c * kKeys;
    for (int64_t j = 0; j < rows; ++j) out[j] = to_f32(src[j * ld_src + c]);
    for (int64_t j = rows; j < kKeys; ++j) out[j] = 0.0f;
  }
}

// ---- scores ---------------------------------------------------------------------------------
// score[s] = sum_j w[j] ReLU(dots[j][s]) for one query over a kKeys tile; dots rows ld apart.
TITAN_INLINE void index_scores(float* score, const float* dots, int64_t ld, const float* w, int64_t HI) {
  vecf acc[kTileVecs];
#pragma GCC unroll 4
  for (int64_t v = 0; v < kTileVecs; ++v) acc[v] = vecf{};
  for (int64_t j = 0; j < HI; ++j) {
    const vecf wj = splat(w[j]);
    // Scalar math: score += w_j ReLU(dots_j)
#pragma GCC unroll 4
    for (int64_t v = 0; v < kTileVecs; ++v) acc[v] += wj * relu(loadv(dots + j * ld + v * kVecLanes));
  }
#pragma GCC unroll 4
  for (int64_t v = 0; v < kTileVecs; ++v) storev(score + v * kVecLanes, acc[v]);
}

#if defined(__AVX512F__)
// score[0, kKeys) += sum_{r < Rows} w[r] ReLU(a_r . b[:, s]): Rows head rows of one query (a_row
// apart, depth elements: f32, or bf16 pairs) against a key block b [depth, kKeys], the head dots
// kept in registers (Rows x kTileVecs accumulators).
template <class E, int Rows>
TITAN_INLINE void head_scores(vecf* score, const E* a, int64_t a_row, const E* b, int64_t depth, const float* w) {
  vecf acc[Rows][kTileVecs];
  tile_products(acc, a, a_row, int64_t(1), b, kKeys, depth);
#pragma GCC unroll 4
  for (int r = 0; r < Rows; ++r) {
    const vecf wr = splat(w[r]);
    // Scalar math: score += w_r ReLU(a_r . b)
#pragma GCC unroll 4
    for (int64_t v = 0; v < kTileVecs; ++v) score[v] += wr * relu(acc[r][v]);
  }
}

// index_scores of one query straight from its head rows and a key block (see head_scores), four
// heads at a time: the [HI, kKeys] dots are never stored and read back.
template <class E>
void fused_scores(float* score, const E* a, int64_t a_row, const E* b, int64_t depth, const float* w, int64_t HI) {
  vecf sc[kTileVecs];
#pragma GCC unroll 4
  for (int64_t v = 0; v < kTileVecs; ++v) sc[v] = vecf{};
  int64_t h = 0;
  for (; h + 4 <= HI; h += 4) head_scores<E, 4>(sc, a + h * a_row, a_row, b, depth, w + h);
  switch (HI - h) {
    case 3: head_scores<E, 3>(sc, a + h * a_row, a_row, b, depth, w + h); break;
    case 2: head_scores<E, 2>(sc, a + h * a_row, a_row, b, depth, w + h); break;
    case 1: head_scores<E, 1>(sc, a + h * a_row, a_row, b, depth, w + h); break;
    default: break;
  }
#pragma GCC unroll 4
  for (int64_t v = 0; v < kTileVecs; ++v) storev(score + v * kVecLanes, sc[v]);
}
#endif

// ---- top-k selection ------------------------------------------------------------------------
// A uint32 that orders like ref/topk.h's ranking: NaN highest, -0 == +0, then by value.
TITAN_INLINE uint32_t rank_bits(float v) {
  uint32_t u = __builtin_bit_cast(uint32_t, v);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  u = u == 0x80000000u ? 0u : u;
  const uint32_t key = u ^ (uint32_t(int32_t(u) >> 31) | 0x80000000u);
  return nan ? 0xffffffffu : key;
}
// Candidates are rank << 32 | ~index: the lower index ranks higher among equal scores.
TITAN_INLINE int32_t candidate_index(uint64_t key) { return int32_t(~uint32_t(key)); }

TITAN_INLINE uint64_t median3(uint64_t x, uint64_t y, uint64_t z) {
  const uint64_t lo_xy = x < y ? x : y, hi_xy = x < y ? y : x;
  return z < lo_xy ? lo_xy : (z > hi_xy ? hi_xy : z);
}

// Moves the k largest of the distinct keys a[0, n) into a[0, k), unordered, for 0 < k < n
// (a[k, n) is left unspecified, and a needs 8 slots of slack past n): quickselect with a
// median-of-three pivot. AVX-512 partitions wide ranges 8 keys at a time, out of place: the keys
// above the pivot are compressed to the front in place (each store lands behind the reads), the
// ones below into tmp ([n + 8] scratch) and copied back behind the pivot, at a fraction of the
// scalar partition's time. Narrow ranges (and other ISAs) run a branch-free Lomuto partition
// (the comparisons are unpredictable, so branches would mispredict about half the time).
void select_largest(uint64_t* a, int64_t n, int64_t k, [[maybe_unused]] uint64_t* tmp) {
  int64_t lo = 0, hi = n;  // invariant: lo < k < hi, a[0, lo) > a[lo, hi) > a[hi, n)
#if defined(__AVX512F__)
  while (hi - lo > 64) {
    const uint64_t pivot = median3(a[lo], a[lo + (hi - lo) / 2], a[hi - 1]);
    const __m512i pv = _mm512_set1_epi64(int64_t(pivot));
    int64_t g = lo, t = 0;
    // Scalar math: keys above the pivot to a[g...], keys below it to tmp[t...]
    for (int64_t i = lo; i < hi; i += 8) {
      const __mmask8 in = hi - i >= 8 ? __mmask8(0xff) : __mmask8((1u << (hi - i)) - 1);
      const __m512i v = _mm512_maskz_loadu_epi64(in, a + i);
      const __mmask8 gt = _mm512_mask_cmpgt_epu64_mask(in, v, pv), lt = _mm512_mask_cmplt_epu64_mask(in, v, pv);
      // Register compresses and whole-vector stores (a compressing store to memory is microcoded
      // on AMD's cores); the lanes past each count are overwritten later.
      _mm512_storeu_si512(a + g, _mm512_maskz_compress_epi64(gt, v));
      _mm512_storeu_si512(tmp + t, _mm512_maskz_compress_epi64(lt, v));
      g += __builtin_popcount(gt);
      t += __builtin_popcount(lt);
    }
    a[g] = pivot;  // now a[lo, g) > pivot = a[g] > a(g, hi)
    __builtin_memcpy(a + g + 1, tmp, size_t(t) * sizeof(uint64_t));
    if (k == g || k == g + 1) return;
    if (k < g) {
      hi = g;
    } else {
      lo = g + 1;
    }
  }
#endif
  for (;;) {
    const int64_t mid = lo + (hi - lo) / 2;
    const uint64_t x = a[lo], y = a[mid], z = a[hi - 1];
    const uint64_t pivot = median3(x, y, z);
    const int64_t at = pivot == x ? lo : (pivot == y ? mid : hi - 1);
    a[at] = a[hi - 1];
    a[hi - 1] = pivot;
    int64_t j = lo;  // a[lo, j) > pivot > a[j, i)
    for (int64_t i = lo; i < hi - 1; ++i) {
      const uint64_t v = a[i];
      a[i] = a[j];
      a[j] = v;
      j += v > pivot;
    }
    a[hi - 1] = a[j];
    a[j] = pivot;  // now a[lo, j) > a[j] = pivot > a(j, hi)
    if (k == j || k == j + 1) return;
    if (k < j) {
      hi = j;
    } else {
      lo = j + 1;
    }
  }
}

// Sample size of compact_candidates' threshold estimate.
constexpr int64_t kSample = 128;
// Spare slots past a top-k candidate row's capacity: the vectorized append stores whole vectors
// of 8 keys at the current count.
constexpr int64_t kSlack = 8;

// Makes room in a full candidate buffer c[0, n) (n > K distinct keys, all above `floor`): raises
// floor to a key below which no top-K key can lie and drops the keys at or under it; returns the
// new count (>= K). An exact select (quickselect, about 7 element operations per key) cost as much
// as all the scoring of a row: instead a strided sample of kSample keys estimates a key a little
// below the K-th largest (rank position m K / n plus two standard deviations of the sampled count),
// one vectorizable pass counts the keys above it, and one branch-free pass keeps those when there
// are at least K of them (so every key at or under the estimate is outranked K times) and at most
// K + (n - K) / 2 and max_keep (so the buffer frees enough room). Otherwise, rarely, the exact
// select runs. sample: [kSample + 8] and tmp: [n + 8] scratch (see select_largest).
int64_t compact_candidates(uint64_t* c, int64_t n, int64_t K, int64_t max_keep, uint64_t& floor, uint64_t* sample,
                           uint64_t* tmp) {
  const int64_t m = min_i64(kSample, n);
  const double expect = double(m) * double(K) / double(n);
  const int64_t r = min_i64(m - 1, int64_t(expect + 2.0 * __builtin_sqrt(expect)) + 1);
  if (r >= 1 && m == kSample) {
    for (int64_t j = 0; j < m; ++j) sample[j] = c[j * n / m];
    select_largest(sample, m, r, tmp);
    uint64_t est = sample[0];
    for (int64_t j = 1; j < r; ++j) est = sample[j] < est ? sample[j] : est;
    int64_t above = 0;
    // Scalar math: above += c > est
#pragma omp simd reduction(+ : above)
    for (int64_t i = 0; i < n; ++i) above += c[i] > est;
    if (above >= K && above <= K + (n - K) / 2 && above <= max_keep) {
      int64_t kept = 0, i = 0;
#if defined(__AVX512F__)
      // 8 keys at a time, compressed in place as in select_largest (c has 8 slots of slack).
      const __m512i ev = _mm512_set1_epi64(int64_t(est));
      // Scalar math: keep the keys c > est, in order
      for (; i + 8 <= n; i += 8) {
        const __m512i v = _mm512_loadu_si512(c + i);
        const __mmask8 keep = _mm512_cmpgt_epu64_mask(v, ev);
        _mm512_storeu_si512(c + kept, _mm512_maskz_compress_epi64(keep, v));
        kept += __builtin_popcount(keep);
      }
#endif
      for (; i < n; ++i) {
        const uint64_t v = c[i];
        c[kept] = v;
        kept += v > est;
      }
      floor = est;
      return kept;
    }
  }
  select_largest(c, n, K, tmp);
  floor = c[0];
  for (int64_t j = 1; j < K; ++j) floor = c[j] < floor ? c[j] : floor;
  return K;
}

// Writes one output row: the n candidate keys' indices (n <= K) in ascending order, then -1.
// bitmap: [ceil(Skv / 64)] zeroed words; left zeroed. AVX-512 reads the bitmap 16 bits at a time,
// compressing the set bits' indices into buf ([K + 16] scratch; whole-vector stores) instead of
// a find-first-set loop per word, whose exits mispredicted once per word.
void write_selection(int32_t* out, const uint64_t* cand, int64_t n, int64_t K, uint64_t* bitmap, int64_t words,
                     [[maybe_unused]] int32_t* buf) {
  for (int64_t i = 0; i < n; ++i) {
    const int32_t s = candidate_index(cand[i]);
    bitmap[s >> 6] |= uint64_t(1) << (s & 63);
  }
  int64_t pos = 0;
#if defined(__AVX512F__)
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t wi = 0; wi < words; ++wi) {
    const uint64_t bits = bitmap[wi];
    if (!bits) continue;
    bitmap[wi] = 0;
    // Scalar math: buf[pos...] = the indices of the set bits of bitmap[wi], ascending
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
      const __mmask16 m = __mmask16(bits >> (16 * q));
      const __m512i index = _mm512_add_epi32(iota, _mm512_set1_epi32(int32_t(wi * 64 + 16 * q)));
      _mm512_storeu_si512(buf + pos, _mm512_maskz_compress_epi32(m, index));
      pos += __builtin_popcount(m);
    }
  }
  __builtin_memcpy(out, buf, size_t(pos) * sizeof(int32_t));
#else
  for (int64_t wi = 0; wi < words; ++wi) {
    uint64_t bits = bitmap[wi];
    bitmap[wi] = 0;
    while (bits) {
      out[pos++] = int32_t(wi * 64 + __builtin_ctzll(bits));
      bits &= bits - 1;
    }
  }
#endif
  for (; pos < K; ++pos) out[pos] = -1;
}

// Keys 0 <= s < valid_keys(d, t) are the candidates of query t (dsa_params.h).
// Packs k [B, Skv, DI] into transposed key blocks kt [B, nkb, DI, kKeys] (zero-padded keys).
template <class T>
void pack_key_blocks(float* kt, const T* k, int64_t B, int64_t Skv, int64_t width, int64_t ld, int64_t nkb) {
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * nkb; ++bk) {
    const int64_t b = bk / nkb, kb = bk % nkb, s0 = kb * kKeys;
    pack_transposed(kt + bk * width * kKeys, k + (b * Skv + s0) * ld, ld, min_i64(kKeys, Skv - s0), width);
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// bf16 top-k on AMX: the head dot products of a (query block, key block) pair are TDPBF16PS tile
// products with f32 accumulation (the f32 FMA path widened bf16 and ran at the f32 rate).
// Operands: query rows as A tiles [rows, di32] bf16 (rows padded to 16, the head dim to 32 with
// zeros) and each key block in the VNNI layout [di32 / 2, kKeys] of bf16 pairs.
constexpr int64_t kAmxDepth = 32;  // bf16 per A tile row

// kv[B, nkb, di32 / 2, kKeys]: pair p of key s0 + j at [p][j] (key rows ld apart, DI wide); keys
// past Skv and dims past DI zero.
void pack_key_pairs(uint32_t* kv, const bf16* k, int64_t B, int64_t Skv, int64_t DI, int64_t ld, int64_t di32,
                    int64_t nkb) {
  const int64_t pairs = di32 / 2;
#pragma omp parallel for schedule(static)
  for (int64_t bk = 0; bk < B * nkb; ++bk) {
    const int64_t b = bk / nkb, s0 = (bk % nkb) * kKeys, rows = min_i64(kKeys, Skv - s0);
    uint32_t* out = kv + bk * pairs * kKeys;
    for (int64_t pr = 0; pr < pairs; ++pr) {
      for (int64_t j = 0; j < kKeys; ++j) {
        const bf16* row = k + (b * Skv + s0 + j) * ld;
        const int64_t c = 2 * pr;
        const bool key = j < rows;
        out[pr * kKeys + j] = pack_pair(key && c < DI ? row[c] : bf16{}, key && c + 1 < DI ? row[c + 1] : bf16{});
      }
    }
  }
}

// dots[m16, kKeys] = qa[m16, di32] x the key block's VNNI pairs, 16 query rows per call.
TITAN_INLINE void amx_dots(float* dots, const bf16* qa, int64_t m16, int64_t di32, const uint32_t* kv_block) {
  for (int64_t r0 = 0; r0 < m16; r0 += 16) {
    amx_row_block(dots + r0 * kKeys, kKeys * 4, 16 * 4, reinterpret_cast<const char*>(qa + r0 * di32), di32 * 2,
                  kAmxDepth * 2, reinterpret_cast<const char*>(kv_block), kKeys * 4, 16 * kKeys * 4, 16 * 4,
                  di32 / kAmxDepth, 4);
  }
}
#endif

}  // namespace

template <class T>
void indexer_topk(int32_t* idx, const T* q, const T* k, const float* w, const IndexerParams& d) {
  const int64_t HI = d.HI, DI = d.DI, K = d.K;
  const int64_t nkb = (d.Skv + kKeys - 1) / kKeys;
  const int64_t tq = max_i64(1, kTargetRows / HI);  // queries per block
  const int64_t nqb = (d.S + tq - 1) / tq;
  const int64_t cap = 4 * K + kKeys;  // candidates per row before a compaction
  const int64_t ld_cand = cap + kSlack;  // candidate row stride
  const int64_t words = (d.Skv + 63) / 64;
  // bf16 keeps its operands as bf16 pairs, multiplied on AMX tiles (see amx_dots) or, without
  // AMX, by VDPBF16PS. Except on AMX, AVX-512 scores each query from its head rows with the head
  // dots in registers (fused_scores); other ISAs run the block's dots as one GEMM, then score.
  bool pairs = false, amx = false;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) pairs = true, amx = cpu_amx_bf16_usable();
  const int64_t di32 = round_up(DI, kAmxDepth), m16 = round_up(tq * HI, 16);
  const Scratch<uint32_t> kv(pairs ? d.B * nkb * (di32 / 2) * kKeys : 1);  // [B, nkb, di32 / 2, kKeys]
  if constexpr (std::is_same_v<T, bf16>) {
    if (pairs) pack_key_pairs(kv.data(), k, d.B, d.Skv, DI, DI, di32, nkb);
  }
#else
  const int64_t m16 = tq * HI;
#endif
#if defined(__AVX512F__)
  const bool fused = !amx;
#else
  const bool fused = false;
#endif
  const Scratch<float> kt(pairs ? 1 : d.B * nkb * DI * kKeys);  // [B, nkb, DI, kKeys]
  if (!pairs) pack_key_blocks(kt.data(), k, d.B, d.Skv, DI, DI, nkb);
#pragma omp parallel
  {
    // dots [m16, kKeys]: the AMX path computes whole 16-row tiles (rows past tq * HI unread).
    const Scratch<float> qa(pairs ? 1 : tq * HI * DI), dots(fused ? 1 : m16 * kKeys), score(kKeys);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    const Scratch<bf16> qa16(pairs ? m16 * di32 : 1, ScratchInit::zeroed);  // [m16, di32] query rows, zero-padded
    if (amx) amx_configure();
#endif
    // sample and tmp: scratch of compact_candidates and select_largest (with its slack).
    const Scratch<uint64_t> cand(tq * ld_cand), bitmap(words, ScratchInit::zeroed), thresh(tq), sample(kSample + 8),
        tmp(ld_cand + 8);
    const Scratch<uint32_t> ranks(kKeys);
    const Scratch<int32_t> sel_buf(K + 16);  // write_selection's
    const Scratch<uint8_t> passes(kKeys);
    const Scratch<int64_t> count(tq);
    // Later query blocks see more keys: hand them out first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = d.B * nqb - 1; item >= 0; --item) {
      const int64_t b = item / nqb, t0 = (item % nqb) * tq, rows = min_i64(tq, d.S - t0);
      // Rows with at most K candidates select them all, unscored.
      int64_t first = 0;
      for (; first < rows && valid_keys(d, t0 + first) <= K; ++first) {
        int32_t* out = idx + (b * d.S + t0 + first) * K;
        const int64_t n = valid_keys(d, t0 + first);
        for (int64_t i = 0; i < K; ++i) out[i] = i < n ? int32_t(i) : -1;
      }
      if (first == rows) continue;
      const T* q_blk = q + (b * d.S + t0) * HI * DI;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
      if constexpr (std::is_same_v<T, bf16>) {
        if (pairs) {
          for (int64_t r = 0; r < rows * HI; ++r) {  // memcpy: a loop of bf16 structs stays 16-bit moves
            bf16* out = qa16.data() + r * di32;
            __builtin_memcpy(out, q_blk + r * DI, size_t(DI) * sizeof(bf16));
            for (int64_t c = DI; c < di32; ++c) out[c] = bf16{};
          }
        }
      }
#endif
      if (!pairs) pack_rows(qa.data(), DI, q_blk, DI, rows * HI, DI);
      for (int64_t i = 0; i < rows; ++i) count.data()[i] = 0, thresh.data()[i] = 0;
      const int64_t n_last = valid_keys(d, t0 + rows - 1);
      for (int64_t kb = 0; kb * kKeys < n_last; ++kb) {
        const float* kt_block = pairs ? nullptr : kt.data() + (b * nkb + kb) * DI * kKeys;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
        const uint32_t* kv_block = kv.data() + (b * nkb + kb) * (di32 / 2) * kKeys;
        if (amx) amx_dots(dots.data(), qa16.data(), round_up(rows * HI, 16), di32, kv_block);
#endif
        if (!fused && !amx) gemm<Tiles, TileStore::write>(dots.data(), kKeys, qa.data(), DI, 1, kt_block, kKeys,
                                                          rows * HI, kKeys, DI);
        const int64_t s0 = kb * kKeys;
        for (int64_t i = first; i < rows; ++i) {
          const int64_t lim = min_i64(kKeys, valid_keys(d, t0 + i) - s0);
          if (lim <= 0) continue;
          const float* w_row = w + (b * d.S + t0 + i) * HI;
#if defined(__AVX512F__)
          if (fused) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
            if (pairs) {
              fused_scores(score.data(), reinterpret_cast<const uint32_t*>(qa16.data()) + i * HI * (di32 / 2), di32 / 2,
                           kv_block, di32 / 2, w_row, HI);
            }
#endif
            if (!pairs) fused_scores(score.data(), qa.data() + i * HI * DI, DI, kt_block, DI, w_row, HI);
          }
#endif
          if (!fused) index_scores(score.data(), dots.data() + i * HI * kKeys, kKeys, w_row, HI);
          uint64_t* c = cand.data() + i * ld_cand;
          // Locals, stored back below: through references the compiler must assume that the
          // candidate stores (uint64_t, which may alias int64_t) change them, and the append
          // loop then ran through memory (a store-to-load chain per key).
          int64_t n = count.data()[i];
          uint64_t floor = thresh.data()[i];
          if (n + lim > cap) n = compact_candidates(c, n, K, cap - kKeys, floor, sample.data(), tmp.data());
          // Once the buffer has been compacted only a few keys per tile reach the admission
          // threshold: flag those whose rank reaches it (integer ops, vectorized), then visit
          // only the flagged ones, eight flags per 64-bit word.
          uint32_t* rank = ranks.data();
          uint8_t* pass = passes.data();
          // Scalar math: rank = s < lim ? rank_bits(score) : 0
#pragma omp simd
          for (int64_t s = 0; s < kKeys; ++s) rank[s] = s < lim ? rank_bits(score.data()[s]) : 0u;
          // Real ranks are >= 1 (rank 0 would be a NaN, which ranks highest), so the keys past
          // lim (rank 0) never pass, even before the first compaction (floor 0).
          const uint32_t floor_rank = max_u32(uint32_t(floor >> 32), 1u);
#if defined(__AVX512F__)
          // Eight keys at a time: build the 64-bit candidates, compare with the floor and
          // compress the passing ones into the buffer (a whole-vector store; rows have kSlack
          // spare slots). Scalar appends cost several cycles each, and until the first
          // compaction every key is appended.
          (void)pass;
          const __m512i floor_v = _mm512_set1_epi64(int64_t(floor)), floor_rank_v = _mm512_set1_epi32(int(floor_rank));
          const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
          // Scalar math: append the candidates (rank << 32 | ~index) above the floor to c
          for (int64_t s = 0; s < kKeys; s += 16) {
            const __m512i rk = _mm512_loadu_si512(rank + s);
            if (!_mm512_cmpge_epu32_mask(rk, floor_rank_v)) continue;
            for (int64_t half = 0; half < 16; half += 8) {
              // (The maskz forms: GCC 12's unmasked ones start from an undefined vector and warn.)
              const __m512i r8 = _mm512_maskz_cvtepu32_epi64(0xff, _mm256_loadu_si256(
                                                                       reinterpret_cast<const __m256i*>(rank + s + half)));
              const __m512i index = _mm512_add_epi64(_mm512_set1_epi64(s0 + s + half), lane);
              const __m512i key = _mm512_or_si512(_mm512_maskz_slli_epi64(0xff, r8, 32),
                                                  _mm512_and_si512(_mm512_xor_si512(index, _mm512_set1_epi64(-1)),
                                                                   _mm512_set1_epi64(0xffffffffLL)));
              const __mmask8 keep = _mm512_cmpgt_epu64_mask(key, floor_v);
              _mm512_storeu_si512(c + n, _mm512_maskz_compress_epi64(keep, key));
              n += __builtin_popcount(keep);
            }
          }
#else
          // Scalar math: pass = rank >= floor_rank
#pragma omp simd
          for (int64_t s = 0; s < kKeys; ++s) pass[s] = rank[s] >= floor_rank;
          for (int64_t word = 0; word < kKeys; word += 8) {
            uint64_t flags;
            __builtin_memcpy(&flags, pass + word, sizeof(flags));
            while (flags) {
              const int64_t s = word + __builtin_ctzll(flags) / 8;
              flags &= flags - 1;  // each flag is one bit (the byte's lowest)
              const uint64_t key = (uint64_t(rank[s]) << 32) | uint32_t(~uint32_t(s0 + s));
              c[n] = key;
              n += key > floor;  // branch-free append (the slot after the last is always free)
            }
          }
#endif
          count.data()[i] = n;
          thresh.data()[i] = floor;
        }
      }
      for (int64_t i = first; i < rows; ++i) {
        uint64_t* c = cand.data() + i * ld_cand;
        const int64_t n = count.data()[i];
        if (n > K) select_largest(c, n, K, tmp.data());
        write_selection(idx + (b * d.S + t0 + i) * K, c, min_i64(n, K), K, bitmap.data(), words, sel_buf.data());
      }
    }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (amx) _tile_release();
#endif
  }
}

namespace {

// ---- KL loss row helpers --------------------------------------------------------------------
#if defined(TITAN_AVX512_ROWS)
// log(x) per lane for finite x > 0 (other lanes: unspecified): x = m 2^e with m in [0.75, 1.5)
// and log m = 2 atanh(u), u = (m - 1) / (m + 1), |u| <= 0.2, by its series to u^11 (truncation
// error below 2e-10). libm's logf, called per selected pair, cost more than the loss's products.
TITAN_INLINE __m512 log16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_getmant_ps(x, _MM_MANT_NORM_p75_1p5, _MM_MANT_SIGN_src);
  __m512 e = _mm512_getexp_ps(x);  // floor(log2 x): one more where m < 1 (the mantissa was halved)
  e = _mm512_mask_add_ps(e, _mm512_cmp_ps_mask(m, one, _CMP_LT_OQ), e, one);
  const __m512 u = _mm512_div_ps(_mm512_sub_ps(m, one), _mm512_add_ps(m, one)), u2 = _mm512_mul_ps(u, u);
  __m512 p = _mm512_set1_ps(1.0f / 11);
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(1.0f / 9));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(1.0f / 7));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(1.0f / 5));
  p = _mm512_fmadd_ps(p, u2, _mm512_set1_ps(1.0f / 3));
  p = _mm512_fmadd_ps(p, u2, one);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693147180559945309f), _mm512_mul_ps(_mm512_add_ps(u, u), p));
}
#endif

// The log-sum-exp of x[0, n), n > 0.
float row_lse(const float* x, int64_t n) {
#if defined(TITAN_AVX512_ROWS)
  const float m = max_span(x, n);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f), shift = _mm512_set1_ps(m * 1.44269504088896341f);
  __m512 sum = _mm512_setzero_ps();
  // Scalar math: sum += exp(x - m)
  for (int64_t s = 0; s < n; s += 16) {
    const __mmask16 k = lanes(n - s);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, exp2_16(_mm512_fmsub_ps(load16(x + s, k), log2e, shift))));
  }
  return m + __builtin_logf(hsum16(sum));
#else
  float m = -__builtin_inff();
  // Scalar math: m = max(m, x)
  for (int64_t s = 0; s < n; ++s) m = x[s] > m ? x[s] : m;
  float sum = 0;
  // Scalar math: sum += exp(x - m)
  for (int64_t s = 0; s < n; ++s) sum += fast_exp(x[s] - m);
  return m + __builtin_logf(sum);
#endif
}

// One row of the loss over cols entries (a multiple of 16): sc holds the scores, p the target;
// the valid entries are those with ok[s] != 0, or s < n when ok is null. Overwrites sc with
// g = gs (exp(sc - lse) - p) on the valid entries and 0 elsewhere, and returns the row's KL term
// sum p (log p - (sc - lse)) over the valid entries with p > 0.
double row_loss(float* sc, const float* p, const float* ok, int64_t n, int64_t cols, float lse, float gs) {
#if defined(TITAN_AVX512_ROWS)
  const __m512 zero = _mm512_setzero_ps(), lse_v = _mm512_set1_ps(lse), gs_v = _mm512_set1_ps(gs);
  const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
  __m512 acc = zero;
  // Scalar math: loss += p (log p - (sc - lse)) where valid and p > 0; sc = valid ? gs (exp(sc - lse) - p) : 0
  for (int64_t s = 0; s < cols; s += 16) {
    const __mmask16 valid = ok ? _mm512_cmp_ps_mask(_mm512_loadu_ps(ok + s), zero, _CMP_NEQ_UQ)
                               : (s < n ? lanes(n - s) : __mmask16(0));
    const __m512 log_q = _mm512_sub_ps(_mm512_loadu_ps(sc + s), lse_v), ps = _mm512_maskz_loadu_ps(valid, p + s);
    const __mmask16 pos = _mm512_cmp_ps_mask(ps, zero, _CMP_GT_OQ);
    acc = _mm512_mask3_fmadd_ps(ps, _mm512_sub_ps(log16(ps), log_q), acc, pos);
    const __m512 prob = exp2_16(_mm512_mul_ps(log_q, log2e));
    _mm512_storeu_ps(sc + s, _mm512_maskz_mul_ps(valid, gs_v, _mm512_sub_ps(prob, ps)));
  }
  return double(hsum16(acc));
#else
  double loss = 0;
  for (int64_t s = 0; s < cols; ++s) {
    if (ok ? ok[s] != 0 : s < n) {
      const float log_q = sc[s] - lse;
      if (p[s] > 0) loss += double(p[s]) * (double(__builtin_logf(p[s])) - double(log_q));
      sc[s] = gs * (fast_exp(log_q) - p[s]);
    } else {
      sc[s] = 0;
    }
  }
  return loss;
#endif
}

// ---- gathered sparse rows -------------------------------------------------------------------
// A sparse-stage row whose selection is small against its causal keys reads the selected key
// rows (kr, di_pad wide, zero-padded) where they are: narrow rows (HI < 16 heads) with the per-key
// kernels below, wide rows through GEMMs over a gathered copy (in the row's gathered path).
// The per-key kernels are kept out of line ([[gnu::noinline]]): inlined into the one function
// that calls them per row (kl_narrow_row), GCC compiled them into more instructions.

// Requests the cache lines of a row of n floats (64-byte aligned rows), for writing if `write`.
TITAN_INLINE void prefetch_row(const float* row, int64_t n, bool write) {
  for (int64_t c = 0; c < n; c += 16) {
    if (write) {
      __builtin_prefetch(row + c, 1);
    } else {
      __builtin_prefetch(row + c, 0);
    }
  }
}

// Key positions of the fold below: folding 16 partial sums in four halving steps leaves key
// 4 (l % 4) + l / 4 in lane l, so keys are fed in that (self-inverse) order.
TITAN_INLINE int64_t fold_order(int64_t l) { return kVecLanes == 16 ? 4 * (l % 4) + l / 4 : l; }

// out lane l = the lane sum of part[fold_order(l)]: kVecLanes dot products from their partial sums.
TITAN_INLINE vecf fold(const vecf* part) {
#if defined(__AVX512F__)
  __m512 a[8], b[4], c[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {  // 128-bit quarters (x0 + x2, x1 + x3, y0 + y2, y1 + y3)
    const __m512 x = (__m512)part[2 * p], y = (__m512)part[2 * p + 1];
    a[p] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, x, y, 0x44), _mm512_maskz_shuffle_f32x4(0xffff, x, y, 0xee));
  }
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {  // quarter q: 4 partial sums of vector 4 p + q
    const __m512 x = a[2 * p], y = a[2 * p + 1];
    b[p] = _mm512_add_ps(_mm512_maskz_shuffle_f32x4(0xffff, x, y, 0x88), _mm512_maskz_shuffle_f32x4(0xffff, x, y, 0xdd));
  }
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p) {  // within quarters: pairs of partial sums of two vectors, interleaved
    const __m512 x = b[2 * p], y = b[2 * p + 1];
    c[p] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  const __m512d x = _mm512_castps_pd(c[0]), y = _mm512_castps_pd(c[1]);
  return (vecf)_mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
#else
  vecf out;
  for (int64_t l = 0; l < kVecLanes; ++l) {
    float sum = 0;
    for (int64_t v = 0; v < kVecLanes; ++v) sum += part[l][v];
    out[l] = sum;
  }
  return out;
#endif
}

// dots[j * ld + s] = q_j . k_{sel[s]} for heads j < HI and keys s < n, 0 for s in [n, cols)
// (cols a multiple of kVecLanes); q rows and key rows di_pad apart, zero a zeroed row. Each
// key row is read as it is: a transposed gather of the keys (for broadcast-FMA tiles) cost a
// scalar store per element, more than the products.
[[gnu::noinline]] void narrow_dots(float* dots, int64_t ld, int64_t cols, const float* q, int64_t HI, int64_t di_pad,
                                   const float* kr, const int32_t* sel, int64_t n, const float* zero) {
  const int64_t vecs = di_pad / kVecLanes;
  int64_t s0 = 0;
  for (; s0 < n; s0 += kVecLanes) {
    const float* rows[kVecLanes];
    for (int64_t l = 0; l < kVecLanes; ++l) {
      const int64_t s = s0 + fold_order(l);
      rows[l] = s < n ? kr + int64_t(sel[s]) * di_pad : zero;
      // The next group's rows are requested now: selected rows are scattered over a key matrix
      // that may not fit in L2 beside the dk partial sums, and their misses stalled the FMAs.
      if (s0 + kVecLanes + l < n) prefetch_row(kr + int64_t(sel[s0 + kVecLanes + l]) * di_pad, di_pad, false);
    }
    for (int64_t j = 0; j < HI; ++j) {
      const float* qj = q + j * di_pad;
      vecf part[kVecLanes];
      const vecf q0 = loadv(qj);
      // Scalar math: dots[j][s0 + fold_order(l)] = q_j . k_{sel[s0 + fold_order(l)]}
#pragma GCC unroll 16
      for (int64_t l = 0; l < kVecLanes; ++l) part[l] = q0 * loadv(rows[l]);
      for (int64_t v = 1; v < vecs; ++v) {
        const vecf qv = loadv(qj + v * kVecLanes);
#pragma GCC unroll 16
        for (int64_t l = 0; l < kVecLanes; ++l) part[l] += qv * loadv(rows[l] + v * kVecLanes);
      }
      storev(dots + j * ld + s0, fold(part));
    }
  }
  for (int64_t j = 0; j < HI; ++j) {
    for (int64_t s = s0; s < cols; ++s) dots[j * ld + s] = 0;
  }
}

#if defined(__AVX512F__)
// narrow_dots for HI <= 4 heads and di_pad <= 64 (the debug indexer: 4 heads of 64 dims). A
// vector holds 4 heads x 4 dims (q4[c] lane 4 h + r = q_h[4 c + r], zero past HI), multiplied by
// a key's dims 4 c .. 4 c + 3 broadcast to its four quarters; each head's 4 lanes then sum to its
// dot. As many FMAs per key as the fold (HI DI / 16 at HI = 4), but ~1.5 shuffles per key instead
// of ~8, which compete with the FMAs for port 5.
// dots4_group: one group of 16 keys, rows[j] the group's key rows, qv = q4's vectors: v[h] =
// head h's dots with the 16 keys. Its four sub-groups of 4 keys run as a loop, not unrolled:
// unrolled, GCC interleaved all sixteen keys' loads and spilled to the stack.
// R = bf16 (avx512_bf16 variant): rows of bf16 pairs, C counting 16-byte steps of 4 pairs (8
// dims); qv[c] lane 4 h + r = head h's pair (8 c + 2 r, 8 c + 2 r + 1); VDPBF16PS takes two dims
// per lane, so a key costs half the multiply-add instructions (and half the row bytes).
template <int C, class R = float>
TITAN_INLINE void dots4_group(__m512* v, const R* const* rows, const __m512* qv, const R* const* next,
                              int64_t n_next) {
  // One step: acc + qv[c] x the key's 16 bytes at c broadcast to the four quarters.
  auto madd = [&](__m512 acc, int c, const R* row) {
    if constexpr (std::is_same_v<R, float>) {
      return _mm512_fmadd_ps(qv[c], _mm512_broadcast_f32x4(_mm_loadu_ps(row + 4 * c)), acc);
    } else {
#if defined(__AVX512BF16__)
      const __m512i k = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 8 * c)));
      return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(qv[c]), reinterpret_cast<__m512bh>(k));
#endif
    }
  };
  // Scalar math: v[h][s] = q_h . k_s for the group's 16 keys s and the heads h < 4 (each lane: 4
  //   dims of one head, or 4 bf16 pairs)
#pragma GCC unroll 1
  for (int g = 0; g < 4; ++g) {
    // A quarter of the next group's rows per sub-group: spread out, the requests overlap the FMAs
    // instead of stalling on the fill buffers as one burst.
    for (int64_t j = 4 * g; j < 4 * g + 4 && j < n_next; ++j)
      prefetch_row(reinterpret_cast<const float*>(next[j]), 4 * C, false);
    __m512 a[4];
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l) {
      const R* row = rows[4 * g + l];
      // Two chains (even and odd steps) halve the multiply-add latency per key.
      __m512 even = madd(_mm512_setzero_ps(), 0, row), odd = madd(_mm512_setzero_ps(), 1, row);
#pragma GCC unroll 16
      for (int c = 2; c < C; c += 2) {
        even = madd(even, c, row);
        odd = madd(odd, c + 1, row);
      }
      a[l] = _mm512_add_ps(even, odd);
    }
    // Per quarter h: (a0[0] + a0[2], a1[0] + a1[2], a0[1] + a0[3], a1[1] + a1[3]), then the
    // 64-bit halves of the two pairs summed: (a0, a1, a2, a3) summed over their 4 lanes.
    const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a[0], a[1]), _mm512_unpackhi_ps(a[0], a[1]));
    const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(a[2], a[3]), _mm512_unpackhi_ps(a[2], a[3]));
    const __m512d d0 = _mm512_castps_pd(t0), d1 = _mm512_castps_pd(t1);
    v[g] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(d0, d1)), _mm512_castpd_ps(_mm512_unpackhi_pd(d0, d1)));
  }
  // Quarter transpose: head h's row takes quarter h of v[0], v[1], v[2], v[3].
  const __m512 t0 = _mm512_maskz_shuffle_f32x4(0xffff, v[0], v[1], 0x44), t1 = _mm512_maskz_shuffle_f32x4(0xffff, v[0], v[1], 0xee);
  const __m512 t2 = _mm512_maskz_shuffle_f32x4(0xffff, v[2], v[3], 0x44), t3 = _mm512_maskz_shuffle_f32x4(0xffff, v[2], v[3], 0xee);
  v[0] = _mm512_maskz_shuffle_f32x4(0xffff, t0, t2, 0x88), v[1] = _mm512_maskz_shuffle_f32x4(0xffff, t0, t2, 0xdd);
  v[2] = _mm512_maskz_shuffle_f32x4(0xffff, t1, t3, 0x88), v[3] = _mm512_maskz_shuffle_f32x4(0xffff, t1, t3, 0xdd);
}

template <int C, class R = float>
[[gnu::noinline]] void narrow_dots4(float* dots, int64_t ld, const float* q4, int64_t HI, const R* kr,
                                    const int32_t* sel, int64_t n, const R* zero) {
  // The row stride is a constant and only the last group checks bounds: with a run-time stride,
  // a check per key and the sub-groups unrolled, GCC spilled q4's vectors and the rows to the
  // stack and broadcast from the copies, at about twice the time per key.
  constexpr int64_t di_pad = std::is_same_v<R, float> ? 4 * C : 8 * C;
  __m512 qv[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q4 + 16 * c);
  const R* rows[16];
  const R* next[16];
  __m512 v[4];
  auto store = [&](int64_t s0) {
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      if (h < HI) _mm512_storeu_ps(dots + h * ld + s0, v[h]);
    }
  };
  int64_t s0 = 0;
  for (; s0 + 16 <= n; s0 += 16) {
    // The next group's rows are requested while this one runs (see narrow_dots).
    const int64_t ahead = s0 + 32 <= n ? 16 : n - s0 - 16;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) rows[j] = kr + int64_t(sel[s0 + j]) * di_pad;
    for (int64_t j = 0; j < ahead; ++j) next[j] = kr + int64_t(sel[s0 + 16 + j]) * di_pad;
    dots4_group<C, R>(v, rows, qv, next, ahead);
    store(s0);
  }
  if (s0 < n) {
    for (int j = 0; j < 16; ++j) rows[j] = s0 + j < n ? kr + int64_t(sel[s0 + j]) * di_pad : zero;
    dots4_group<C, R>(v, rows, qv, next, 0);
    store(s0);
  }
}

// narrow_dots4 for di_pad in {16, 32, 48, 64} (the quad path's rows); q4 [di_pad / 4, 16] as there.
void narrow_dots4(int64_t di_pad, float* dots, int64_t ld, const float* q4, int64_t HI, const float* kr,
                  const int32_t* sel, int64_t n, const float* zero) {
  switch (di_pad) {
    case 16: return narrow_dots4<4>(dots, ld, q4, HI, kr, sel, n, zero);
    case 32: return narrow_dots4<8>(dots, ld, q4, HI, kr, sel, n, zero);
    case 48: return narrow_dots4<12>(dots, ld, q4, HI, kr, sel, n, zero);
    default: return narrow_dots4<16>(dots, ld, q4, HI, kr, sel, n, zero);
  }
}

#if defined(__AVX512BF16__)
// The same over bf16 key rows read in place (rows di_pad bf16 apart, di_pad in {16, 32, 48, 64}),
// q4 [di_pad / 8, 16] bf16 pairs (see dots4_group).
void narrow_dots4(int64_t di_pad, float* dots, int64_t ld, const float* q4, int64_t HI, const bf16* kr,
                  const int32_t* sel, int64_t n, const bf16* zero) {
  switch (di_pad) {
    case 16: return narrow_dots4<2, bf16>(dots, ld, q4, HI, kr, sel, n, zero);
    case 32: return narrow_dots4<4, bf16>(dots, ld, q4, HI, kr, sel, n, zero);
    case 48: return narrow_dots4<6, bf16>(dots, ld, q4, HI, kr, sel, n, zero);
    default: return narrow_dots4<8, bf16>(dots, ld, q4, HI, kr, sel, n, zero);
  }
}
#endif
#endif

// dq_j += sum_s g2[j * ld + s] k_{sel[s]} (dq [HI, di_pad]) and dk_{sel[s]} += sum_j g2[j * ld + s] q_j
// over the n selected keys (distinct), key and dk rows V vectors wide, read and updated in place.
// The dq rows of kGroup heads stay in registers while the keys stream past.
template <int V>
[[gnu::noinline]] void narrow_grads(float* dq, float* dk, const float* g2, int64_t ld, const float* q, int64_t HI,
                                    const float* kr, const int32_t* sel, int64_t n) {
  constexpr int kGroup = V >= 16 ? 1 : 16 / V;
  constexpr int64_t kAhead = 16;  // keys between a row's prefetch and its use
  constexpr int64_t di_pad = V * kVecLanes;
  for (int64_t j0 = 0; j0 < HI; j0 += kGroup) {
    const int64_t hg = min_i64(kGroup, HI - j0);
    vecf acc[kGroup][V];
#pragma GCC unroll 16
    for (int g = 0; g < kGroup; ++g) {
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[g][v] = g < hg ? loadv(dq + (j0 + g) * di_pad + v * kVecLanes) : vecf{};
    }
    for (int64_t s = 0; s < n; ++s) {
      const float* krow = kr + int64_t(sel[s]) * di_pad;
      float* dkrow = dk + int64_t(sel[s]) * di_pad;
      if (s + kAhead < n) {  // see narrow_dots
        prefetch_row(kr + int64_t(sel[s + kAhead]) * di_pad, di_pad, false);
        prefetch_row(dk + int64_t(sel[s + kAhead]) * di_pad, di_pad, true);
      }
      vecf kv[V], dv[V];
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) kv[v] = loadv(krow + v * kVecLanes), dv[v] = loadv(dkrow + v * kVecLanes);
      // Scalar math: dq_j += g2[j][s] k_s; dk_s += g2[j][s] q_j, per selected key s
#pragma GCC unroll 16
      for (int g = 0; g < kGroup; ++g) {
        if (g >= hg) break;
        const float c = g2[(j0 + g) * ld + s];
        const float* qj = q + (j0 + g) * di_pad;
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          acc[g][v] += c * kv[v];
          dv[v] += c * loadv(qj + v * kVecLanes);
        }
      }
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) storev(dkrow + v * kVecLanes, dv[v]);
    }
#pragma GCC unroll 16
    for (int g = 0; g < kGroup; ++g) {
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        if (g < hg) storev(dq + (j0 + g) * di_pad + v * kVecLanes, acc[g][v]);
      }
    }
  }
}

#if defined(__AVX512BF16__)
// narrow_grads for bf16 quad rows (HI <= 4 heads, keys bf16 in place, DI = 16 V dims with V even),
// both products on VDPBF16PS with g2 rounded to bf16 as an operand (as sparse MLA rounds dS):
//   dq_j += sum over key pairs i of (g2[j][2i], g2[j][2i + 1]) . (k_{2i}, k_{2i + 1}) by dim,
//   dk_s += (g2[0][s], g2[1][s]) . (q_0, q_1) + (g2[2][s], g2[3][s]) . (q_2, q_3) by dim,
// half the multiply-add instructions of the f32 products. g2 rows are ld apart and hold zeros
// from n to round_up(n, 64). gh [2, ld] and gs [4, ld / 2]: scratch for g2's two pair layouts.
template <int V>
[[gnu::noinline]] void narrow_grads_pairs(float* dq, float* dk, const float* g2, int64_t ld, const float* q, int64_t HI,
                                          const bf16* kb, const int32_t* sel, int64_t n, const bf16* zero, uint32_t* gh,
                                          uint32_t* gs) {
  constexpr int64_t DI = 16 * V, kAhead = 16;
  const __m512 none = _mm512_setzero_ps();
  auto g2_row = [&](int64_t h, int64_t s) { return h < HI ? _mm512_loadu_ps(g2 + h * ld + s) : none; };
  for (int64_t s = 0; s < n; s += 16) {  // gh[p][s] = (g2[2p][s], g2[2p + 1][s])
    // Scalar math: gh[p][s] = (g2[2p][s], g2[2p + 1][s]) as a bf16 pair
    for (int64_t p = 0; p < 2; ++p) _mm512_storeu_si512(gh + p * ld + s, pack_pair_ps(g2_row(2 * p, s), g2_row(2 * p + 1, s)));
  }
  for (int64_t h = 0; h < HI; ++h) {  // gs[h][i] = (g2[h][2i], g2[h][2i + 1]): the row in bf16
    // Scalar math: gs[h] = g2[h] in bf16
    for (int64_t s = 0; s < n; s += 32) store_bf16(reinterpret_cast<bf16*>(gs + h * (ld / 2) + s / 2), g2 + h * ld + s, 32);
  }
  __m512i qp[2][V];  // (q_{2p}, q_{2p + 1}) pairs by dim
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      const __m512 q0 = 2 * p < HI ? _mm512_loadu_ps(q + 2 * p * DI + 16 * v) : none;
      const __m512 q1 = 2 * p + 1 < HI ? _mm512_loadu_ps(q + (2 * p + 1) * DI + 16 * v) : none;
      qp[p][v] = pack_pair_ps(q0, q1);
    }
  }
  __m512 acc[4][V];
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[h][v] = h < HI ? _mm512_loadu_ps(dq + h * DI + 16 * v) : none;
  }
  auto bcast = [](const uint32_t* x) { return reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(*x))); };
  // Scalar math: dq_h += (g2[h][s], g2[h][s + 1]) . (k_s, k_{s+1}); dk_u += sum over head pairs (g2[2p][u],
  //   g2[2p+1][u]) . (q_2p, q_2p+1)
  for (int64_t s = 0; s < n; s += 2) {
    const bool odd = s + 1 == n;  // the last key pairs with a zero row (its g2 column is 0)
    const bf16* r0 = kb + int64_t(sel[s]) * DI;
    const bf16* r1 = odd ? zero : kb + int64_t(sel[s + 1]) * DI;
    for (int64_t u = s + kAhead; u < s + kAhead + 2 && u < n; ++u) {
      prefetch_row(reinterpret_cast<const float*>(kb + int64_t(sel[u]) * DI), DI / 2, false);
      prefetch_row(dk + int64_t(sel[u]) * DI, DI, true);
    }
    __m512bh kp[V];  // 32 dims of the two rows per pair of vectors of 16 pairs
#pragma GCC unroll 4
    for (int c = 0; c < V / 2; ++c) {
      __m512i lo, hi;
      row_pair_vectors(_mm512_loadu_si512(r0 + 32 * c), _mm512_loadu_si512(r1 + 32 * c), lo, hi);
      kp[2 * c] = reinterpret_cast<__m512bh>(lo);
      kp[2 * c + 1] = reinterpret_cast<__m512bh>(hi);
    }
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
      if (h >= HI) break;
      const __m512bh a = bcast(gs + h * (ld / 2) + s / 2);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) acc[h][v] = _mm512_dpbf16_ps(acc[h][v], a, kp[v]);
    }
    for (int64_t u = s; u < s + 2 && u < n; ++u) {
      float* dkrow = dk + int64_t(sel[u]) * DI;
      const __m512bh a0 = bcast(gh + u), a1 = bcast(gh + ld + u);
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        const __m512 d = _mm512_dpbf16_ps(_mm512_loadu_ps(dkrow + 16 * v), a0, reinterpret_cast<__m512bh>(qp[0][v]));
        _mm512_storeu_ps(dkrow + 16 * v, _mm512_dpbf16_ps(d, a1, reinterpret_cast<__m512bh>(qp[1][v])));
      }
    }
  }
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) {
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if (h < HI) _mm512_storeu_ps(dq + h * DI + 16 * v, acc[h][v]);
    }
  }
}
#endif

// narrow_grads for vecs = di_pad / kVecLanes in [1, 8].
void narrow_grads(int64_t vecs, float* dq, float* dk, const float* g2, int64_t ld, const float* q, int64_t HI,
                  const float* kr, const int32_t* sel, int64_t n) {
  switch (vecs) {
    case 1: return narrow_grads<1>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 2: return narrow_grads<2>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 3: return narrow_grads<3>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 4: return narrow_grads<4>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 5: return narrow_grads<5>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 6: return narrow_grads<6>(dq, dk, g2, ld, q, HI, kr, sel, n);
    case 7: return narrow_grads<7>(dq, dk, g2, ld, q, HI, kr, sel, n);
    default: return narrow_grads<8>(dq, dk, g2, ld, q, HI, kr, sel, n);
  }
}
// The valid entries (0 <= s < n_valid) of one selection row, in order, into sel with their
// per-slot targets into p; returns their count, or -1 as soon as one is not above the one before
// (a repeat is possible: the caller deduplicates instead). The indexer's top-k lists each row's
// keys in ascending order, so this is the common case, and it needs no membership bitmap: its
// read-modify-write of one word per slot serialized the loop through memory.
int64_t increasing_selection(int32_t* sel, float* p, const int32_t* idx, const float* target, int64_t K,
                             int64_t n_valid) {
  int64_t n = 0;
  int32_t last = -1;
  int64_t e = 0;
#if defined(__AVX512F__)
  // Sixteen slots at a time: compress the valid ones, then check the compressed run ascends.
  const __m512i lo = _mm512_set1_epi32(-1), hi = _mm512_set1_epi32(int32_t(n_valid));
  // Scalar math: sel, p += the valid slots (0 <= idx < n_valid) and their targets, in order
  for (; e + 16 <= K; e += 16) {
    const __m512i s = _mm512_loadu_si512(idx + e);
    const __mmask16 ok = _mm512_cmpgt_epi32_mask(s, lo) & _mm512_cmplt_epi32_mask(s, hi);
    // Whole-vector stores of the compressed lanes (n + 16 <= e + 16 <= K: inside the buffers);
    // a masked compress straight to memory is several times slower.
    _mm512_storeu_si512(sel + n, _mm512_maskz_compress_epi32(ok, s));
    _mm512_storeu_ps(p + n, _mm512_maskz_compress_ps(ok, _mm512_loadu_ps(target + e)));
    n += __builtin_popcount(ok);
  }
  // Scalar math: fail unless sel[j] < sel[j + 1] for every j
  for (int64_t j = 0; j + 1 < n; j += 16) {
    const __mmask16 pairs = _cvtu32_mask16((n - 1 - j) >= 16 ? 0xffffu : (1u << (n - 1 - j)) - 1);
    const __m512i a = _mm512_maskz_loadu_epi32(pairs, sel + j), b = _mm512_maskz_loadu_epi32(pairs, sel + j + 1);
    if (_mm512_mask_cmpge_epi32_mask(pairs, a, b)) return -1;
  }
  if (n > 0) last = sel[n - 1];
#endif
  for (; e < K; ++e) {
    const int32_t s = idx[e];
    if (s < 0 || s >= n_valid) continue;
    if (s <= last) return -1;
    last = s;
    sel[n] = s;
    p[n++] = target[e];
  }
  return n;
}

// Narrow rows keep up to 8 vectors per key row in registers.
constexpr int64_t kNarrowVecs = 8;
// Wide rows: dk rows produced per GEMM before they are added to the partial sums.
constexpr int64_t kWideChunk = 256;

// ---- KL loss: the plan ----------------------------------------------------------------------
// Both stages of the loss run each query block on one of three paths:
// * blocked (the dense stage, and with AMX the sparse blocks of wide rows whose selections cover
//   at least half of their causal keys): two passes over the block's key blocks, the lse of I,
//   then target, loss and gradients per key block (kl_blocked);
// * gathered narrow rows (the other sparse blocks, HI < 16 heads of at most 128 dims): row by row,
//   dots against the selected key rows read in place, then per-key gradient products
//   (kl_narrow_row);
// * gathered wide rows (the remaining sparse blocks): row by row, the selected key rows gathered
//   and multiplied in GEMMs with the heads as columns (kl_wide_row).
// The plan fixes the paths and the buffer sizes of one call from its sizes, dtype and CPU.
struct KlPlan {
  bool dense;  // the dense warm-up stage (idx == nullptr): every causal key, the target recomputed
  int64_t HI, DI, H, Hk, D, group;
  int64_t di_pad, hi_pad;         // DI and HI padded to whole vectors
  int64_t nkb, skv_pad, words;    // key blocks; keys padded to whole blocks; words of a key bitmap
  int64_t tq, nqb, m_max, n_cap;  // queries per block; query blocks; tq * HI; one gathered selection
  float scale, gs, inv_h;
  int threads;
  // bf16 in the avx512_bf16 variant: the blocked path's indexer dots and dense target products
  // (tau mq mk^T) take bf16 pair operands (pairs) with f32 accumulation, on AMX tiles (amx) or by
  // VDPBF16PS; its gradient products (G k, G^T q) stay f32. pair_blocks: the B operands of those
  // products are VNNI pair blocks (kv, mkv) instead of kt, mkt. d32, di32: D, DI padded to AMX depth.
  bool pairs = false, amx = false, pair_blocks = false;
  int64_t d32 = 0, di32 = 0;
  // Gathered rows: narrow (per-key kernels) or wide (GEMMs). quad: narrow rows of up to 4 heads
  // and 64 dims (narrow_dots4, AVX-512). pair_dots: bf16 quad rows of whole 16-dim rows take their
  // dots from the bf16 keys in place, two dims per lane (VDPBF16PS); pair_grads: their gradient
  // products too, when the rows are whole 32-dim pairs of vectors (32 or 64 dims).
  bool narrow, quad, pair_dots = false, pair_grads;
  // keys_in_place: f32 keys of a whole vector width (and vector-aligned, as the per-key kernels
  // load them) are the sparse stage's key rows as they are: only the selected rows (< Skv) are
  // read, and a packed copy would be one more megabyte in cache per 4096 keys beside the dk
  // partial sums. no_kr: no packed key rows at all (also for the bf16 pair products of pair_grads,
  // which read the bf16 keys in place).
  bool keys_in_place, no_kr;
};

template <class T>
KlPlan make_kl_plan(const IndexerParams& d, const IndexerTargetParams& td, bool dense, const T* k,
                    double grad_scale) {
  KlPlan p;
  p.dense = dense;
  p.HI = d.HI, p.DI = d.DI, p.H = td.H, p.Hk = td.Hk, p.D = td.D, p.group = dense ? td.H / td.Hk : 1;
  p.di_pad = round_up(p.DI, kPadLanes), p.hi_pad = round_up(p.HI, kPadLanes);
  p.nkb = (d.Skv + kKeys - 1) / kKeys, p.skv_pad = p.nkb * kKeys, p.words = (d.Skv + 63) / 64;
  // Queries per block. The blocked dense target multiplies each main head's [tq, D] queries by
  // every [D, kKeys] key block, so tq is its GEMM height: 64 rows give each streamed key element 64
  // FMAs (16 rows left it bound by L2/L3 bandwidth). tq * HI stays <= 1024 (the indexer tiles).
  p.tq = max_i64(1, min_i64(kDenseQueries, kMaxDenseRows / p.HI));
  p.nqb = (d.S + p.tq - 1) / p.tq, p.m_max = p.tq * p.HI;
  p.n_cap = dense ? kKeys : round_up(max_i64(d.K, 1), kKeys);
  p.scale = float(td.scale), p.gs = float(grad_scale), p.inv_h = dense ? 1.0f / float(p.H) : 1.0f;
  p.threads = omp_get_max_threads();
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) p.pairs = true, p.amx = cpu_amx_bf16_usable();
  p.d32 = round_up(p.D, kAmxDepth), p.di32 = round_up(p.DI, kAmxDepth);
  // The sparse stage takes the blocked path only with AMX (kl_covers_half).
  p.pair_blocks = p.pairs && (dense || p.amx);
#endif
  p.narrow = p.HI < kPadLanes && p.di_pad <= kNarrowVecs * kVecLanes;
  p.quad = kVecLanes == 16 && p.narrow && p.HI <= 4 && p.di_pad <= 64;
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16>) p.pair_dots = p.quad && p.DI == p.di_pad;
#endif
  p.pair_grads = p.pair_dots && p.DI % 32 == 0;
  p.keys_in_place = std::is_same_v<T, float> && !dense && p.DI == p.di_pad &&
                    reinterpret_cast<uintptr_t>(k) % (kVecLanes * sizeof(float)) == 0;
  p.no_kr = p.keys_in_place || (!dense && p.pair_grads);
  return p;
}

// The operands every thread reads, packed once per call (one element where unused):
//   kr [B, skv_pad, di_pad]: key rows, the B operand of dq = G k (rows past Skv zero);
//   kt [B, nkb, DI, kKeys]: transposed key blocks, the B operand of the scores (f32 blocked path);
//   mkt [B, Hk, nkb, D, kKeys]: transposed main key blocks, the dense target's (f32 blocked path);
//   kv [B, nkb, di32 / 2, kKeys], mkv [B, Hk, nkb, d32 / 2, kKeys]: the same as VNNI pair blocks;
//   dk_part [threads, B, skv_pad, di_pad]: per-thread dk partial sums, summed into dk at the end;
//   block_loss [B * nqb]: each query block's share of the loss, summed in block order at the end:
//   with the blocks dealt round-robin (schedule(static, 1)), every sum (the loss, each thread's dk
//   partial) runs in the same order on every call, so the results do not vary run to run.
template <class T>
struct KlShared {
  const Scratch<float> kr, kt, mkt;
  const Scratch<uint32_t> kv, mkv;
  const int64_t dk_len;
  const Scratch<float> dk_part;
  Scratch<double> block_loss;

  KlShared(const KlPlan& p, const IndexerParams& d, const T* k, const T* mk)
      : kr(p.no_kr ? 1 : d.B * p.skv_pad * p.di_pad, ScratchInit::zeroed),
        kt(p.pairs || !p.dense ? 1 : d.B * p.nkb * p.DI * kKeys),
        mkt(p.pairs || !p.dense ? 1 : d.B * p.Hk * p.nkb * p.D * kKeys),
        kv(p.pair_blocks ? d.B * p.nkb * (p.di32 / 2) * kKeys : 1),
        mkv(p.pairs && p.dense ? d.B * p.Hk * p.nkb * (p.d32 / 2) * kKeys : 1),
        dk_len(d.B * p.skv_pad * p.di_pad),
        dk_part(p.threads * dk_len, ScratchInit::zeroed),
        block_loss(d.B * p.nqb, ScratchInit::zeroed) {
    const int64_t DI = p.DI, D = p.D, Hk = p.Hk, nkb = p.nkb;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if constexpr (std::is_same_v<T, bf16>) {
      if (p.pair_blocks) {
        pack_key_pairs(kv.data(), k, d.B, d.Skv, DI, DI, p.di32, nkb);
        for (int64_t bh = 0; bh < (p.dense ? d.B * Hk : 0); ++bh) {
          pack_key_pairs(mkv.data() + bh * nkb * (p.d32 / 2) * kKeys, mk + ((bh / Hk) * d.Skv * Hk + bh % Hk) * D, 1,
                         d.Skv, D, Hk * D, p.d32, nkb);
        }
      }
    }
#endif
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (p.no_kr ? 0 : d.B * d.Skv); ++r) {
      const int64_t b = r / d.Skv, s = r % d.Skv;
      pack_rows(kr.data() + (b * p.skv_pad + s) * p.di_pad, p.di_pad, k + r * DI, DI, 1, DI);
    }
    if (!p.pairs && p.dense) pack_key_blocks(kt.data(), k, d.B, d.Skv, DI, DI, nkb);
    // mk [B, Skv, Hk, D] seen as B * Hk sequences of Skv rows D wide, Hk * D apart.
#pragma omp parallel for schedule(static)
    for (int64_t item = 0; item < (p.pairs || !p.dense ? 0 : d.B * Hk * nkb); ++item) {
      const int64_t bh = item / nkb, kb = item % nkb, b = bh / Hk, h = bh % Hk, s0 = kb * kKeys;
      pack_transposed(mkt.data() + item * D * kKeys, mk + ((b * d.Skv + s0) * Hk + h) * D, Hk * D,
                      min_i64(kKeys, d.Skv - s0), D);
    }
  }

  // Batch b's key rows [skv_pad or Skv, di_pad] (null with no_kr).
  const float* key_rows(const KlPlan& p, const IndexerParams& d, const T* k, int64_t b) const {
    if constexpr (std::is_same_v<T, float>) {
      if (p.keys_in_place) return k + b * d.Skv * p.DI;
    }
    return p.no_kr ? nullptr : kr.data() + b * p.skv_pad * p.di_pad;
  }
};

// One thread's buffers (one element where its paths do not run).
struct KlThread {
  float* dk_acc;         // this thread's dk partial sums [B, skv_pad, di_pad]
  double item_loss = 0;  // the current block's loss
  // Packed queries qa [m_max, di_pad] (and mqa [H, tq, D], the f32 dense target's), the block's dq
  // and dw sums, and the blocked path's per-row running max and sum.
  const Scratch<float> qa, mqa, dq_acc, dw_acc, row_max, row_sum;
  // Blocked path tiles: dots [m16, kKeys] and g2 [m_max, kKeys], scores, target and validity [tq,
  // kKeys], the dense target's product tile [tq16, kKeys] (dots and tile rows padded to whole AMX
  // tiles); bf16 pair A operands: query rows qa16 [m16, di32] and main queries mqa16 [H, tq16, d32],
  // zero-padded (padding rows may hold an earlier block's rows: finite, their outputs unread).
  const int64_t m16, tq16;
  const Scratch<float> dots, g2, score, target, ok, tile;
  const Scratch<bf16> qa16, mqa16;
  // Sparse stage only: the block's selections as bitmaps selmap [tq, words] (blocked path); for the
  // gathered paths one row's selection sel (deduplicated through `seen`) with its scores and
  // target [n_cap]; narrow rows: dots and g2 [HI, n_cap], a zero key row (zero_row, zero16 for
  // bf16 rows), q4 (narrow_dots4's packed heads) and g_pairs (narrow_grads_pairs' gh [2, n_cap] and
  // gs [4, n_cap / 2]); wide rows: dT (r_dots) [n_cap, hi_pad], the gathered key rows kg [n_cap,
  // di_pad], qT [DI, hi_pad], the padded weights wv and a chunk of dk rows dkg [kWideChunk, di_pad].
  const Scratch<uint64_t> selmap, seen;
  const Scratch<int32_t> sel;
  const Scratch<float> r_dots, r_g2, r_score, r_target, zero_row;
  const Scratch<float> kg, dkg, qT, wv, q4;
  const Scratch<bf16> zero16;
  const Scratch<uint32_t> g_pairs;

  KlThread(const KlPlan& p, float* dk_partial)
      : dk_acc(dk_partial),
        qa(p.m_max * p.di_pad),
        mqa(p.pairs || !p.dense ? 1 : p.H * p.tq * p.D),
        dq_acc(p.m_max * p.di_pad),
        dw_acc(p.m_max),
        row_max(p.tq),
        row_sum(p.tq),
        m16(round_up(p.m_max, 16)),
        tq16(round_up(p.tq, 16)),
        dots(m16 * kKeys),
        g2(p.m_max * kKeys),
        score(p.tq * kKeys),
        target(p.tq * kKeys),
        ok(p.tq * kKeys),
        tile(p.dense ? tq16 * kKeys : 1),
        qa16(p.pair_blocks ? m16 * p.di32 : 1, ScratchInit::zeroed),
        mqa16(p.pairs && p.dense ? p.H * tq16 * p.d32 : 1, ScratchInit::zeroed),
        selmap(p.dense ? 1 : p.tq * p.words, ScratchInit::zeroed),
        seen(p.dense ? 1 : p.words, ScratchInit::zeroed),
        sel(!p.dense ? p.n_cap : 1),
        r_dots(!p.dense ? p.hi_pad * p.n_cap : 1),
        r_g2(!p.dense && p.narrow ? p.HI * p.n_cap : 1),
        r_score(!p.dense ? p.n_cap : 1),
        r_target(!p.dense ? p.n_cap : 1),
        zero_row(!p.dense && p.narrow ? p.di_pad : 1, ScratchInit::zeroed),
        kg(!p.dense && !p.narrow ? p.n_cap * p.di_pad : 1),
        dkg(!p.dense && !p.narrow ? kWideChunk * p.di_pad : 1),
        qT(!p.dense && !p.narrow ? p.DI * p.hi_pad : 1),
        wv(!p.dense && !p.narrow ? p.hi_pad : 1),
        q4(p.quad ? 4 * p.di_pad : 1),
        zero16(p.pair_dots ? p.di_pad : 1, ScratchInit::zeroed),
        g_pairs(p.pair_grads ? 4 * p.n_cap : 1) {}
};

// ---- KL loss: the paths ---------------------------------------------------------------------
// Loss and gradient of `rows` query rows over `cols` columns (a multiple of kKeys): sc, p
// [rows, ld] scores and target, dots [rows * HI, ld]; the valid entries are those with
// ok_rows[i * ld + s] != 0, or s < n when ok_rows is null (row_loss). Adds the rows' KL terms to
// loss, overwrites sc with g, writes g2 = g w 1[dot > 0] and adds g ReLU(dot) to dw (rows * HI).
void kl_rows(double& loss, const KlPlan& pl, int64_t rows, int64_t cols, int64_t ld, float* sc_all,
             const float* p_all, const float* dots_all, float* g2_all, const float* lse, const float* w_rows,
             float* dw_rows, const float* ok_rows, int64_t n) {
  const int64_t HI = pl.HI;
  for (int64_t i = 0; i < rows; ++i) {
    float* sc = sc_all + i * ld;
    loss += row_loss(sc, p_all + i * ld, ok_rows ? ok_rows + i * ld : nullptr, n, cols, lse[i], pl.gs);
    for (int64_t j = 0; j < HI; ++j) {
      const float* dj = dots_all + (i * HI + j) * ld;
      float* gj = g2_all + (i * HI + j) * ld;
      vecf dw_v = vecf{};
      const vecf wj = splat(w_rows[i * HI + j]);
      // Scalar math: dw_j += g * ReLU(dot_j); g2_j = dot_j > 0 ? g * w_j : 0
      for (int64_t s = 0; s < cols; s += kVecLanes) {
        const vecf dot = loadv(dj + s), g = loadv(sc + s);
        dw_v += g * relu(dot);
        storev(gj + s, dot > splat(0.0f) ? g * wj : splat(0.0f));
      }
      float sum = 0;
      for (int64_t v = 0; v < kVecLanes; ++v) sum += dw_v[v];
      dw_rows[i * HI + j] += sum;
    }
  }
}

// Packs query block (b, t0) of `rows` queries for its path: qa (always), and per the plan the f32
// main queries mqa or the bf16 pair operands qa16 and mqa16; zeroes its dq and dw sums.
template <class T>
void kl_pack_block(const KlPlan& p, KlThread& th, const T* q, const T* mq, int64_t row0, int64_t rows) {
  const int64_t HI = p.HI, DI = p.DI, H = p.H, D = p.D, M = rows * HI;
  pack_rows(th.qa.data(), p.di_pad, q + row0 * HI * DI, DI, M, DI);
  if (!p.pairs && p.dense) {
    for (int64_t h = 0; h < H; ++h) pack_rows(th.mqa.data() + h * p.tq * D, D, mq + (row0 * H + h) * D, H * D, rows, D);
  }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if (p.pair_blocks) {
    for (int64_t r = 0; r < M; ++r) {
      __builtin_memcpy(th.qa16.data() + r * p.di32, q + (row0 * HI + r) * DI, size_t(DI) * sizeof(T));
    }
    for (int64_t h = 0; h < (p.dense ? H : 0); ++h) {
      for (int64_t i = 0; i < rows; ++i) {
        __builtin_memcpy(th.mqa16.data() + (h * th.tq16 + i) * p.d32, mq + ((row0 + i) * H + h) * D,
                         size_t(D) * sizeof(T));
      }
    }
  }
#endif
  for (int64_t j = 0; j < M * p.di_pad; ++j) th.dq_acc.data()[j] = 0;
  for (int64_t j = 0; j < M; ++j) th.dw_acc.data()[j] = 0;
}

// Sparse stage: each row gathers its own selection, except with AMX wide rows: there a block
// whose selections cover at least half of its causal keys runs the blocked (dense-style) path with
// the selections as a mask, its dots as bf16 tile products (the gathered path's GEMMs are f32).
// Without AMX the gathered path was faster even where every causal key is selected: the blocked
// path computes the dots twice (lse pass, then gradients), the gathered one keeps them. Marks the
// block's valid selections in selmap on the way.
bool kl_covers_half(const KlPlan& p, KlThread& th, const IndexerParams& d, const int32_t* idx, int64_t row0,
                    int64_t t0, int64_t rows) {
  int64_t picked = 0, causal = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = valid_keys(d, t0 + i);
    causal += n;
    uint64_t* bits = th.selmap.data() + i * p.words;
    for (int64_t e = 0; e < d.K; ++e) {
      const int32_t s = idx[(row0 + i) * d.K + e];
      if (s < 0 || s >= n) continue;
      picked += ((bits[s >> 6] >> (s & 63)) & 1) == 0;
      bits[s >> 6] |= uint64_t(1) << (s & 63);
    }
  }
  return 2 * picked >= causal;
}

// dots [M, kKeys] = the indexer head dot products of the block's M query rows with key block kb.
template <class T>
void kl_block_dots(const KlPlan& p, const KlShared<T>& sh, KlThread& th, int64_t b, int64_t kb, int64_t M) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  const uint32_t* kv_block = sh.kv.data() + (b * p.nkb + kb) * (p.di32 / 2) * kKeys;
  if (p.amx) return amx_dots(th.dots.data(), th.qa16.data(), round_up(M, 16), p.di32, kv_block);
  if (p.pairs) {
    return gemm<Tiles, TileStore::write>(th.dots.data(), kKeys, reinterpret_cast<const uint32_t*>(th.qa16.data()),
                                         p.di32 / 2, int64_t(1), kv_block, kKeys, M, kKeys, p.di32 / 2);
  }
#endif
  gemm<Tiles, TileStore::write>(th.dots.data(), kKeys, th.qa.data(), p.di_pad, 1,
                                sh.kt.data() + (b * p.nkb + kb) * p.DI * kKeys, kKeys, M, kKeys, p.DI);
}

// The blocked path for query block (b, t0) of `rows` queries (rows b * S + t0 + i): two passes over
// its key blocks, masked to the selections in the sparse stage (selmap, from kl_covers_half).
template <class T>
void kl_blocked(const KlPlan& p, const KlShared<T>& sh, KlThread& th, const IndexerParams& d, const float* mlse,
                const int32_t* idx, const float* slot_target, const float* w_blk, int64_t b, int64_t t0,
                int64_t rows) {
  const bool dense = p.dense;
  const int64_t HI = p.HI, H = p.H, D = p.D, M = rows * HI, row0 = b * d.S + t0, di_pad = p.di_pad;
  const int64_t n_last = valid_keys(d, t0 + rows - 1);
  float* score = th.score.data();
  float* target = th.target.data();
  float* row_max = th.row_max.data();
  float* row_sum = th.row_sum.data();
  // ok[i][s] = 1 where key s0 + s counts for query row i; returns whether any does.
  auto tile_mask = [&](int64_t s0) {
    bool any = false;
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t n = valid_keys(d, t0 + i);
      const uint64_t* bits = th.selmap.data() + i * p.words;
      float* m = th.ok.data() + i * kKeys;
      for (int64_t s = 0; s < kKeys; ++s) {
        const int64_t key = s0 + s;
        const bool v = key < n && (dense || ((bits[key >> 6] >> (key & 63)) & 1));
        m[s] = v ? 1.0f : 0.0f;
        any |= v;
      }
    }
    return any;
  };
  auto valid = [&](int64_t i, int64_t s) { return th.ok.data()[i * kKeys + s] != 0.0f; };
  // Pass 1: running max and sum of exp of I per row.
  for (int64_t i = 0; i < rows; ++i) row_max[i] = -__builtin_inff(), row_sum[i] = 0;
  for (int64_t kb = 0; kb * kKeys < n_last; ++kb) {
    if (!tile_mask(kb * kKeys)) continue;
    kl_block_dots(p, sh, th, b, kb, M);
    for (int64_t i = 0; i < rows; ++i) {
      float* sc = score + i * kKeys;
      index_scores(sc, th.dots.data() + i * HI * kKeys, kKeys, w_blk + i * HI, HI);
      float m = row_max[i];
      for (int64_t s = 0; s < kKeys; ++s) m = valid(i, s) && sc[s] > m ? sc[s] : m;
      if (m == -__builtin_inff()) continue;  // no valid key in this tile or before
      float sum = 0;
      // Scalar math: sum += valid ? exp(sc - m) : 0
      for (int64_t s = 0; s < kKeys; ++s) sum += valid(i, s) ? fast_exp(sc[s] - m) : 0.0f;
      row_sum[i] = row_sum[i] * fast_exp(row_max[i] - m) + sum;
      row_max[i] = m;
    }
  }
  for (int64_t i = 0; i < rows; ++i) row_max[i] += __builtin_logf(row_sum[i]);  // now the lse
  // Pass 2: scores again, target, loss, gradients per key block.
  for (int64_t kb = 0; kb * kKeys < n_last; ++kb) {
    const int64_t s0 = kb * kKeys;
    if (!tile_mask(s0)) continue;
    kl_block_dots(p, sh, th, b, kb, M);
    for (int64_t i = 0; i < rows * kKeys; ++i) target[i] = 0;
    if (!dense) {  // the given per-slot target, scattered to this key block's columns
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t row = row0 + i, n = valid_keys(d, t0 + i);
        for (int64_t e = 0; e < d.K; ++e) {
          const int64_t key = idx[row * d.K + e];
          if (key < s0 || key >= s0 + kKeys || key >= n) continue;
          target[i * kKeys + key - s0] += slot_target[row * d.K + e];
        }
      }
    }
    for (int64_t h = 0; h < (dense ? H : 0); ++h) {
      // The next head's key block (or this head's next one) is prefetched meanwhile.
      const int64_t next_h = h + 1 < H ? h + 1 : 0, next_kb = h + 1 < H ? kb : kb + 1;
      const bool has_next = next_kb * kKeys < n_last;
      const int64_t g = h / p.group, next_g = next_h / p.group;
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
      const uint32_t* mkv_block = sh.mkv.data() + ((b * p.Hk + g) * p.nkb + kb) * (p.d32 / 2) * kKeys;
      const bf16* mq_h = th.mqa16.data() + h * th.tq16 * p.d32;
      if (p.amx) {
        for (int64_t r0 = 0; r0 < rows; r0 += 16) {
          amx_row_block(th.tile.data() + r0 * kKeys, kKeys * 4, 16 * 4,
                        reinterpret_cast<const char*>(mq_h + r0 * p.d32), p.d32 * 2, kAmxDepth * 2,
                        reinterpret_cast<const char*>(mkv_block), kKeys * 4, 16 * kKeys * 4, 16 * 4,
                        p.d32 / kAmxDepth, 4);
        }
      } else if (p.pairs) {
        gemm<Tiles, TileStore::write>(th.tile.data(), kKeys, reinterpret_cast<const uint32_t*>(mq_h), p.d32 / 2,
                                      int64_t(1), mkv_block, kKeys, rows, kKeys, p.d32 / 2);
      }
#endif
      if (!p.pairs) {
        const float* mkt = sh.mkt.data();
        gemm<Tiles, TileStore::write>(th.tile.data(), kKeys, th.mqa.data() + h * p.tq * D, D, 1,
                                      mkt + ((b * p.Hk + g) * p.nkb + kb) * D * kKeys, kKeys, rows, kKeys, D,
                                      has_next ? mkt + ((b * p.Hk + next_g) * p.nkb + next_kb) * D * kKeys : nullptr,
                                      has_next ? kKeys * kKeys : 0);
      }
      for (int64_t i = 0; i < rows; ++i) {
        const float lse_h = mlse[(row0 + i) * H + h];
        float* pt = target + i * kKeys;
        const float* c = th.tile.data() + i * kKeys;
        // Scalar math: p += exp(tau * mq_h . mk_s - mlse_h)
#pragma omp simd
        for (int64_t s = 0; s < kKeys; ++s) pt[s] += fast_exp(p.scale * c[s] - lse_h);
      }
    }
    if (dense) {
      for (int64_t i = 0; i < rows * kKeys; ++i) target[i] *= p.inv_h;
    }
    for (int64_t i = 0; i < rows; ++i) {
      index_scores(score + i * kKeys, th.dots.data() + i * HI * kKeys, kKeys, w_blk + i * HI, HI);
    }
    kl_rows(th.item_loss, p, rows, kKeys, kKeys, score, target, th.dots.data(), th.g2.data(), row_max, w_blk,
            th.dw_acc.data(), th.ok.data(), 0);
    // dq += G2 k_block; dk_block += G2^T q.
    gemm<Tiles, TileStore::accumulate>(th.dq_acc.data(), di_pad, th.g2.data(), kKeys, 1,
                                       sh.kr.data() + (b * p.skv_pad + s0) * di_pad, di_pad, M, di_pad, kKeys);
    gemm<Tiles, TileStore::accumulate>(th.dk_acc + (b * p.skv_pad + s0) * di_pad, di_pad, th.g2.data(), 1, kKeys,
                                       th.qa.data(), di_pad, kKeys, di_pad, M);
  }
}

// Row `row` of the sparse stage: its valid selection, each key once, in idx order, into th.sel
// with its targets in th.r_target (a key listed twice gets the sum of its slots' targets; the
// search runs only for repeats). Returns the count.
int64_t kl_row_selection(KlThread& th, const IndexerParams& d, const int32_t* idx, const float* slot_target,
                         int64_t row, int64_t n_valid) {
  int32_t* sel = th.sel.data();
  float* p = th.r_target.data();
  uint64_t* seen = th.seen.data();
  int64_t n = increasing_selection(sel, p, idx + row * d.K, slot_target + row * d.K, d.K, n_valid);
  if (n >= 0) return n;
  // A valid index repeats (or the order is not ascending): deduplicate.
  n = 0;
  for (int64_t e = 0; e < d.K; ++e) {
    const int32_t s = idx[row * d.K + e];
    if (s < 0 || s >= n_valid) continue;
    const float pe = slot_target[row * d.K + e];
    if ((seen[s >> 6] >> (s & 63)) & 1) {
      int64_t j = 0;
      while (sel[j] != s) ++j;
      p[j] += pe;
      continue;
    }
    seen[s >> 6] |= uint64_t(1) << (s & 63);
    p[n] = pe;
    sel[n++] = s;
  }
  for (int64_t j = 0; j < n; ++j) seen[sel[j] >> 6] = 0;
  return n;
}

// A narrow gathered row (query row `row`, row i of its block) with n selected keys in th.sel:
// dots [HI, cols] per key row read in place, scores, loss, then dq and dk per key. kr_b: batch b's
// key rows (f32; unused with pair_grads), kb16: batch b's bf16 keys (pair_dots only).
template <class T>
void kl_narrow_row(const KlPlan& p, KlThread& th, [[maybe_unused]] const T* q, const float* kr_b,
                   [[maybe_unused]] const bf16* kb16, const float* w_row, float* dk_b, [[maybe_unused]] int64_t row,
                   int64_t i, int64_t n) {
  const int64_t HI = p.HI, di_pad = p.di_pad, n_cap = p.n_cap;
  const float* q_row = th.qa.data() + i * HI * di_pad;
  float* dq_row = th.dq_acc.data() + i * HI * di_pad;
  float* sc = th.r_score.data();
  float* tg = th.r_target.data();
  float* dots = th.r_dots.data();
  const int64_t cols = round_up(n, kKeys);
  for (int64_t s = n; s < cols; ++s) tg[s] = 0;
#if defined(__AVX512F__)
  if (p.quad && p.pair_dots) {
#if defined(__AVX512BF16__)
    // bf16 keys in place: q4[c] quarter h = head h's bf16 dims 8 c .. 8 c + 7 as 4 pairs.
    const int64_t DI = p.DI;
    const bf16* q16 = reinterpret_cast<const bf16*>(q) + row * HI * DI;
    for (int64_t c = 0; c < di_pad / 8; ++c) {
      __m512i v = _mm512_setzero_si512();
      // Scalar math: q4[c] quarter h = head h's bf16 dims 8 c .. 8 c + 7
      for (int64_t h = 0; h < HI; ++h) {
        v = _mm512_mask_broadcast_i32x4(v, __mmask16(0xf << (4 * h)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(q16 + h * DI + 8 * c)));
      }
      _mm512_storeu_si512(th.q4.data() + c * 16, v);
    }
    narrow_dots4(di_pad, dots, n_cap, th.q4.data(), HI, kb16, th.sel.data(), n, th.zero16.data());
#endif
  } else if (p.quad) {
    // q4[c] quarter h = head h's dims 4 c .. 4 c + 3 (zero past HI).
    for (int64_t c = 0; c < di_pad / 4; ++c) {
      __m512 v = _mm512_setzero_ps();
      // Scalar math: q4[c] quarter h = head h's dims 4 c .. 4 c + 3
      for (int64_t h = 0; h < HI; ++h) {
        v = _mm512_mask_broadcast_f32x4(v, __mmask16(0xf << (4 * h)), _mm_loadu_ps(q_row + h * di_pad + 4 * c));
      }
      _mm512_storeu_ps(th.q4.data() + c * 16, v);
    }
    narrow_dots4(di_pad, dots, n_cap, th.q4.data(), HI, kr_b, th.sel.data(), n, th.zero_row.data());
  }
  if (p.quad) {
    for (int64_t j = 0; j < HI; ++j) {
      for (int64_t s = round_up(n, 16); s < cols; ++s) dots[j * n_cap + s] = 0;
    }
  }
#endif
  if (!p.quad) narrow_dots(dots, n_cap, cols, q_row, HI, di_pad, kr_b, th.sel.data(), n, th.zero_row.data());
  for (int64_t c0 = 0; c0 < cols; c0 += kKeys) index_scores(sc + c0, dots + c0, n_cap, w_row, HI);
  const float lse = row_lse(sc, n);
  kl_rows(th.item_loss, p, 1, cols, n_cap, sc, tg, dots, th.r_g2.data(), &lse, w_row, th.dw_acc.data() + i * HI,
          nullptr, n);
#if defined(__AVX512BF16__)
  if (p.pair_grads) {
    uint32_t* gh = th.g_pairs.data();
    if (p.DI == 64) {
      narrow_grads_pairs<4>(dq_row, dk_b, th.r_g2.data(), n_cap, q_row, HI, kb16, th.sel.data(), n,
                            th.zero16.data(), gh, gh + 2 * n_cap);
    } else {
      narrow_grads_pairs<2>(dq_row, dk_b, th.r_g2.data(), n_cap, q_row, HI, kb16, th.sel.data(), n,
                            th.zero16.data(), gh, gh + 2 * n_cap);
    }
    return;
  }
#endif
  narrow_grads(di_pad / kVecLanes, dq_row, dk_b, th.r_g2.data(), n_cap, q_row, HI, kr_b, th.sel.data(), n);
}

// A wide gathered row (row i of its block) with n selected keys in th.sel: dT [n, hi_pad] =
// kg [n, di_pad] (the selected key rows, gathered) times qT [DI, hi_pad] (the row's heads as
// columns, zero past HI), a GEMM whose vectors span 16 heads; dT becomes G2^T in place; dq += G2 kg,
// dk rows += G2^T q in chunks.
void kl_wide_row(const KlPlan& p, KlThread& th, const float* kr_b, const float* w_row, float* dk_b, int64_t i,
                 int64_t n) {
  const int64_t HI = p.HI, DI = p.DI, di_pad = p.di_pad, hi_pad = p.hi_pad;
  const int32_t* sel = th.sel.data();
  const float* q_row = th.qa.data() + i * HI * di_pad;
  float* dq_row = th.dq_acc.data() + i * HI * di_pad;
  float* sc = th.r_score.data();
  float* dT = th.r_dots.data();
  float* kg = th.kg.data();
  float* qT = th.qT.data();
  float* wv = th.wv.data();
  for (int64_t s = 0; s < n; ++s) {
    const float* src = kr_b + int64_t(sel[s]) * di_pad;
    float* dst = kg + s * di_pad;
    for (int64_t c = 0; c < di_pad; ++c) dst[c] = src[c];
  }
  for (int64_t c = 0; c < DI; ++c) {
    for (int64_t j = 0; j < hi_pad; ++j) qT[c * hi_pad + j] = j < HI ? q_row[j * di_pad + c] : 0.0f;
  }
  for (int64_t j = 0; j < hi_pad; ++j) wv[j] = j < HI ? w_row[j] : 0.0f;
  gemm<Tiles, TileStore::write>(dT, hi_pad, kg, di_pad, 1, qT, hi_pad, n, hi_pad, DI);
  for (int64_t s = 0; s < n; ++s) {
    vecf acc = vecf{};
    // Scalar math: sc[s] = sum_j w_j ReLU(dT[s][j])
    for (int64_t v = 0; v < hi_pad; v += kVecLanes) acc += loadv(wv + v) * relu(loadv(dT + s * hi_pad + v));
    float sum = 0;
    for (int64_t l = 0; l < kVecLanes; ++l) sum += acc[l];
    sc[s] = sum;
  }
  const float lse = row_lse(sc, n);
  th.item_loss += row_loss(sc, th.r_target.data(), nullptr, n, round_up(n, kPadLanes), lse, p.gs);
  for (int64_t v = 0; v < hi_pad; v += kVecLanes) {
    const vecf wj = loadv(wv + v);
    vecf dw_v = vecf{};
    // Scalar math: dw_j += g_s ReLU(dT[s][j]); dT[s][j] = dT[s][j] > 0 ? g_s w_j : 0
    for (int64_t s = 0; s < n; ++s) {
      const vecf g = splat(sc[s]), dot = loadv(dT + s * hi_pad + v);
      dw_v += g * relu(dot);
      storev(dT + s * hi_pad + v, dot > splat(0.0f) ? g * wj : splat(0.0f));
    }
    for (int64_t l = 0; l < kVecLanes && v + l < HI; ++l) th.dw_acc.data()[i * HI + v + l] += dw_v[l];
  }
  gemm<Tiles, TileStore::accumulate>(dq_row, di_pad, dT, 1, hi_pad, kg, di_pad, HI, di_pad, n);
  for (int64_t c0 = 0; c0 < n; c0 += kWideChunk) {
    const int64_t m = min_i64(kWideChunk, n - c0);
    gemm<Tiles, TileStore::write>(th.dkg.data(), di_pad, dT + c0 * hi_pad, hi_pad, 1, q_row, di_pad, m, di_pad, HI);
    for (int64_t j = 0; j < m; ++j) {
      float* dst = dk_b + int64_t(sel[c0 + j]) * di_pad;
      const float* src = th.dkg.data() + j * di_pad;
      // Scalar math: dk[sel] += dkg
#pragma omp simd
      for (int64_t c = 0; c < di_pad; ++c) dst[c] += src[c];
    }
  }
}

// Both stages of the loss. Dense (idx == nullptr): the target is recomputed from mq, mk and mlse
// (td) over every causal key. Sparse: V_t = the valid entries of idx[t] and the target is given
// per slot (slot_target [B, S, K], summed over a key's slots when it is listed twice); mq, mk,
// mlse and td are unused.
template <class T>
double kl_loss(T* dq, T* dk, float* dw, const T* q, const T* k, const float* w, const T* mq, const T* mk,
               const float* mlse, const IndexerTargetParams& td, const int32_t* idx, const float* slot_target,
               const IndexerParams& d, double grad_scale) {
  const KlPlan p = make_kl_plan(d, td, idx == nullptr, k, grad_scale);
  const KlShared<T> sh(p, d, k, mk);
  const int64_t HI = p.HI, DI = p.DI;
#pragma omp parallel
  {
    KlThread th(p, sh.dk_part.data() + omp_get_thread_num() * sh.dk_len);
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (p.amx) amx_configure();
#endif
#pragma omp for schedule(static, 1)
    for (int64_t item = d.B * p.nqb - 1; item >= 0; --item) {
      const int64_t b = item / p.nqb, t0 = (item % p.nqb) * p.tq, rows = min_i64(p.tq, d.S - t0), M = rows * HI;
      const int64_t row0 = b * d.S + t0;  // first global query row
      const float* w_blk = w + row0 * HI;
      kl_pack_block(p, th, q, mq, row0, rows);
      const bool blocked = p.dense || (p.amx && !p.narrow && kl_covers_half(p, th, d, idx, row0, t0, rows));
      if (blocked) {
        kl_blocked(p, sh, th, d, mlse, idx, slot_target, w_blk, b, t0, rows);
      } else {
        const float* kr_b = sh.key_rows(p, d, k, b);
        const bf16* kb16 = std::is_same_v<T, bf16> ? reinterpret_cast<const bf16*>(k) + b * d.Skv * DI : nullptr;
        float* dk_b = th.dk_acc + b * p.skv_pad * p.di_pad;
        for (int64_t i = 0; i < rows; ++i) {
          const int64_t n = kl_row_selection(th, d, idx, slot_target, row0 + i, valid_keys(d, t0 + i));
          if (n == 0) continue;  // no valid key: no loss, zero gradients
          if (p.narrow) {
            kl_narrow_row(p, th, q, kr_b, kb16, w_blk + i * HI, dk_b, row0 + i, i, n);
          } else {
            kl_wide_row(p, th, kr_b, w_blk + i * HI, dk_b, i, n);
          }
        }
      }
      if (!p.dense) {  // leave the selection bitmaps zeroed for the next block
        for (int64_t i = 0; i < rows; ++i) {
          uint64_t* bits = th.selmap.data() + i * p.words;
          for (int64_t e = 0; e < d.K; ++e) {
            const int32_t s = idx[(row0 + i) * d.K + e];
            if (s >= 0 && s < d.Skv) bits[s >> 6] = 0;
          }
        }
      }
      // This block's dq and dw rows are complete.
      for (int64_t r = 0; r < M; ++r) {
        T* out = dq + (row0 * HI + r) * DI;
        const float* in = th.dq_acc.data() + r * p.di_pad;
        for (int64_t c = 0; c < DI; ++c) out[c] = from_f32<T>(in[c]);
        dw[row0 * HI + r] = th.dw_acc.data()[r];
      }
      sh.block_loss.data()[item] = th.item_loss;
      th.item_loss = 0;
    }
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    if (p.amx) _tile_release();
#endif
  }
  // dk = the sum of the per-thread partials.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < d.B * d.Skv; ++r) {
    const int64_t b = r / d.Skv, s = r % d.Skv;
    const int64_t off = (b * p.skv_pad + s) * p.di_pad;
    float* acc = sh.dk_part.data() + off;
    for (int t = 1; t < p.threads; ++t) {
      const float* part = sh.dk_part.data() + t * sh.dk_len + off;
      // Scalar math: dk += part
#pragma omp simd
      for (int64_t c = 0; c < DI; ++c) acc[c] += part[c];
    }
    for (int64_t c = 0; c < DI; ++c) dk[r * DI + c] = from_f32<T>(acc[c]);
  }
  double loss = 0;
  for (int64_t item = 0; item < d.B * p.nqb; ++item) loss += sh.block_loss.data()[item];
  return loss;
}
}  // namespace

template <class T>
double indexer_kl_loss(T* dq, T* dk, float* dw, const T* q, const T* k, const float* w, const T* mq, const T* mk,
                       const float* mlse, const IndexerParams& d, const IndexerTargetParams& td, double grad_scale) {
  return kl_loss(dq, dk, dw, q, k, w, mq, mk, mlse, td, nullptr, nullptr, d, grad_scale);
}

template <class T>
double indexer_kl_loss_sparse(T* dq, T* dk, float* dw, const T* q, const T* k, const float* w, const int32_t* idx,
                              const float* target, const IndexerParams& d, double grad_scale) {
  return kl_loss<T>(dq, dk, dw, q, k, w, nullptr, nullptr, nullptr, IndexerTargetParams{}, idx, target, d, grad_scale);
}

template <class T>
void hadamard_transform(T* x, int64_t rows, int64_t n) {
  const float norm = 1.0f / __builtin_sqrtf(float(n));
#pragma omp parallel
  {
    const Scratch<float> buf(n);
    float* v = buf.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T* xr = x + r * n;
      for (int64_t i = 0; i < n; ++i) v[i] = to_f32(xr[i]);
      // Butterflies: after the pass of width h, v holds the transform of each aligned 2h block.
      for (int64_t h = 1; h < n; h *= 2) {
        for (int64_t i0 = 0; i0 < n; i0 += 2 * h) {
          // Scalar math: (v[i], v[i + h]) = (v[i] + v[i + h], v[i] - v[i + h])
#pragma omp simd
          for (int64_t i = i0; i < i0 + h; ++i) {
            const float a = v[i], c = v[i + h];
            v[i] = a + c;
            v[i + h] = a - c;
          }
        }
      }
      for (int64_t i = 0; i < n; ++i) xr[i] = from_f32<T>(v[i] * norm);
    }
  }
}

#define TITAN_LI_INSTANTIATE(T)                                                                                  \
  template void indexer_topk<T>(int32_t*, const T*, const T*, const float*, const IndexerParams&);               \
  template double indexer_kl_loss<T>(T*, T*, float*, const T*, const T*, const float*, const T*, const T*,       \
                                     const float*, const IndexerParams&, const IndexerTargetParams&, double);    \
  template double indexer_kl_loss_sparse<T>(T*, T*, float*, const T*, const T*, const float*, const int32_t*,    \
                                            const float*, const IndexerParams&, double);                         \
  template void hadamard_transform<T>(T*, int64_t, int64_t);
TITAN_LI_INSTANTIATE(float)
TITAN_LI_INSTANTIATE(bf16)
#undef TITAN_LI_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
