// Flash attention on the CPU, FlashAttention-2 blocking: a block of kBlock query rows stays
// resident while key/value blocks stream past, and scores only ever exist as kBlock x kBlock
// tiles (held transposed, keys by queries; see the forward). Every product is a register-tiled
// micro-GEMM (cpu/tile_gemm.h) over packed, zero-padded buffers.
// bf16 with both head dims multiples of 32 runs its products on bf16 pairs (see "bf16 pairs"):
// AMX tiles where usable, else VDPBF16PS register tiles (AVX512_BF16; on Zen 4/5 twice the f32
// FMA rate). Other bf16 shapes, MLA's in-place keys and CPUs without AVX512_BF16 widen bf16 to
// f32 once, while packing (O(S D) work against O(S^2 D) products).
#include "titan/kernels/cpu/attention.h"

#include <omp.h>

#include <type_traits>

#include "titan/core/allocator.h"
#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/cpu/tile_gemm.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "titan/kernels/cpu/amx.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Query rows and key columns per tile: a 64 x 64 f32 score tile is 16 KiB and stays in L1 next to
// the key block it came from.
constexpr int64_t kBlock = 64;
// Blocks that share each streamed block of the other side: the forward runs kGroupBlocks query
// blocks against every key/value block it loads, the backward kGroupBlocks key blocks against
// every query-side block. A key block and a value block are 32 KiB each at D = 128; reusing them
// 4 times from L1/L2 instead of refetching them from L3 per query block is what keeps the
// micro-kernels fed at S = 2048 (whose per-head k and v no longer fit in L2).
constexpr int64_t kGroupBlocks = 4;
// The products' register tiles (cpu/tile_gemm.h): 6 x 4 vectors with AVX-512. The B strip of a
// pass (at most 128 k steps of 4 vectors: 32 KiB) stays in L1 while the row tiles run over it; a
// longer K (Dqk = 192 for MLA: a 48 KiB strip, the whole L1) takes two passes.
struct Tiles : TileDefaults {
#if defined(__AVX512F__)
  static constexpr int kRows = 6, kVecs = 4;
#elif defined(__AVX2__)
  static constexpr int kRows = 6, kVecs = 2;
#else
  static constexpr int kRows = 4, kVecs = 2;
#endif
  static constexpr int kNarrowRows = kRows;
  static constexpr int64_t kDepth = 128;
};
typedef int32_t veci __attribute__((vector_size(sizeof(int32_t) * kVecLanes)));

TITAN_INLINE vecf maxv(vecf a, vecf b) { return a > b ? a : b; }
// fast_exp (cpu/isa.h) on a vector with the same range reduction and polynomial, written on
// vecf so it vectorizes at every ISA level without relying on the auto-vectorizer. Rounds with
// the 1.5 * 2^23 trick (round to nearest even, exact for |x log2 e| < 2^22). -inf gives 0.
TITAN_INLINE vecf exp_v(vecf x) {
  x = x < splat(-87.33654f) ? splat(-87.33654f - 1.0f) : x;
  x = x > splat(88.72283f) ? splat(88.72283f) : x;
  const vecf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vecf r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  vecf p = splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  veci e = __builtin_convertvector(n, veci) + 127;
  e = e < 0 ? 0 : e;
  e = e > 255 ? 255 : e;
  const vecf scale = (vecf)(e << 23);
  return p * scale;
}

// ---- diagonal blocks ------------------------------------------------------------------------
// gemm over a diagonal (causal) block, skipping the products that only ever meet masked (key j >
// query i) entries. At S = 512 a quarter of the blocks are diagonal and half of each is masked,
// so the full-tile products spent about a tenth of all work on entries that end as 0.
//   queries_across: rows are keys j, columns queries i (S^T, dP^T). A row tile from key r0 only
//     computes columns from the query vector holding r0: the columns it skips are all i < r0 <= j,
//     masked; the caller masks (mask_diagonal) or overwrites them.
//   keys_upto_row: rows are queries i, k runs over keys (o += P v, dq += dS k). A row tile ending
//     at query r1 stops k at key r1: P and dS are exactly 0 beyond it.
//   queries_from_row: rows are keys j, k runs over queries (dv += P^T dO, dk += dS^T q). A row tile
//     from key r0 starts k at query r0: P and dS are exactly 0 before it.
// The skipped terms are exact zeros (their P or dS entries are 0 and the other operand is finite),
// so every kept sum adds the same nonzero terms in the same order as the full product.
enum class Diagonal { queries_across, keys_upto_row, queries_from_row };
template <Diagonal kMode, bool kAccumulate>
void gemm_diagonal(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb,
                   int64_t M, int64_t N, int64_t K) {
  static_assert(kMode == Diagonal::queries_across || kAccumulate, "the k-limited modes add into C");
  constexpr TileStore kFirst = kAccumulate ? TileStore::accumulate : TileStore::write;
  constexpr int kRows = Tiles::kRows, kVecs = Tiles::kVecs;
  constexpr int64_t kStrip = kVecs * kVecLanes, kDepth = Tiles::kDepth;
  if constexpr (kMode == Diagonal::queries_across) {
    for (int64_t k0 = 0; k0 < K; k0 += kDepth) {
      const int64_t kc = min_i64(K - k0, kDepth);
      for (int64_t m = 0; m < M; m += kRows) {
        const int64_t rows = min_i64(kRows, M - m);
        for (int64_t n = m / kVecLanes * kVecLanes; n < N; n += kStrip) {
          const int64_t vecs = min_i64((N - n) / kVecLanes, kVecs);
          const StridedRows ct{c + m * ldc + n, ldc};
          const float* at = a + m * a_row + k0 * a_k;
          const float* bt = b + k0 * ldb + n;
          if (k0 == 0) {
            gemm_tile_tail<Tiles, kVecs, kFirst>(vecs, rows, ct, at, a_row, a_k, bt, ldb, kc);
          } else {
            gemm_tile_tail<Tiles, kVecs, TileStore::accumulate>(vecs, rows, ct, at, a_row, a_k, bt, ldb, kc);
          }
        }
      }
    }
  } else {
    for (int64_t n = 0; n < N; n += kStrip) {
      const int64_t vecs = min_i64((N - n) / kVecLanes, kVecs);
      for (int64_t m = 0; m < M; m += kRows) {
        const int64_t rows = min_i64(kRows, M - m);
        const int64_t k_lo = kMode == Diagonal::queries_from_row ? min_i64(m, K) : 0;
        const int64_t k_hi = kMode == Diagonal::keys_upto_row ? min_i64(m + rows, K) : K;
        for (int64_t k0 = k_lo; k0 < k_hi; k0 += kDepth) {
          gemm_tile_tail<Tiles, kVecs, TileStore::accumulate>(vecs, rows, StridedRows{c + m * ldc + n, ldc},
                                                              a + m * a_row + k0 * a_k, a_row, a_k, b + k0 * ldb + n,
                                                              ldb, min_i64(k_hi - k0, kDepth));
        }
      }
    }
  }
}

// ---- packing --------------------------------------------------------------------------------
// Sizes derived from AttentionParams, shared by forward and backward.
struct Plan {
  int64_t group;    // query heads per kv head
  int64_t nblk;     // query (and key) blocks per sequence
  int64_t s_pad;    // nblk * kBlock
  int64_t dqk_pad;  // Dqk rounded up to 16
  int64_t dv_pad;   // Dv rounded up to 16
};

Plan make_plan(const AttentionParams& d) {
  Plan p;
  p.group = d.H / d.Hkv;
  p.nblk = (d.S + kBlock - 1) / kBlock;
  p.s_pad = p.nblk * kBlock;
  p.dqk_pad = round_up(d.Dqk, kPadLanes);
  p.dv_pad = round_up(d.Dv, kPadLanes);
  return p;
}

// dst[j][c] = scale * src[j][c] for j < rows, c < width, and 0 for width <= c < ld_dst (the
// padding that micro-kernels read as B-operand columns).
// One head's rows lie H * D elements apart, a stride the hardware prefetchers do not follow past
// each row's end: packing waited on memory for every row. Prefetching a few rows ahead overlaps
// those misses.
constexpr int64_t kPrefetchRows = 4;
// The same goes for the rows the kernels read and write back per head (o, dq, dk, dv): kWrite
// prefetches for ownership.
template <bool kWrite = false, class T>
TITAN_INLINE void prefetch_row(const T* row, int64_t width) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t off = 0; off < width * int64_t(sizeof(T)); off += 64) __builtin_prefetch(p + off, kWrite ? 1 : 0, 3);
}

template <class T>
void pack_rows(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t width, float scale) {
  for (int64_t j = 0; j < rows; ++j) {
    if (j + kPrefetchRows < rows) prefetch_row(src + (j + kPrefetchRows) * ld_src, width);
    const T* row = src + j * ld_src;
    float* out = dst + j * ld_dst;
    // Scalar math: out = scale * row
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) out[c] = scale * to_f32(row[c]);
    for (int64_t c = width; c < ld_dst; ++c) out[c] = 0.0f;
  }
}

// dst[c][j] = scale * src[j][c] for one block of rows: the B operand whose columns are queries.
// Columns j >= rows are zeroed. dst [width, kBlock]. Sixteen source rows by sixteen columns at a
// time go through an L1 tile, so each store is one contiguous vector and each source line is read
// once: one head's rows lie H * D elements apart, often a multiple of 4 KiB, so sixteen of them
// share one L1 set, and reading them column by column refetched every line from L2 per column.
// With AVX-512, full 16-column groups of f32 rows transpose in shuffles (transpose16_u32): the
// scalar column copies cost the f32 backward at S = 512 about 5% of its time.
template <class T>
void pack_transposed(float* dst, const T* src, int64_t ld_src, int64_t rows, int64_t width, float scale) {
  alignas(64) float tile[kPadLanes][kPadLanes];  // [16 rows, 16 columns]
  for (int64_t j0 = 0; j0 < kBlock; j0 += kPadLanes) {
    const int64_t n = rows - j0 < 0 ? 0 : min_i64(kPadLanes, rows - j0);
    // rows of the next group
    const int64_t next = rows - j0 - kPadLanes < 0 ? 0 : min_i64(kPadLanes, rows - j0 - kPadLanes);
    for (int64_t jj = 0; jj < next; ++jj) prefetch_row(src + (j0 + kPadLanes + jj) * ld_src, width);
    for (int64_t c0 = 0; c0 < width; c0 += kPadLanes) {
      const int64_t w = min_i64(kPadLanes, width - c0);
#if defined(TITAN_AVX512_ROWS)
      if constexpr (std::is_same_v<T, float>) {
        if (w == kPadLanes) {
          const __m512 m = _mm512_set1_ps(scale);
          // Scalar math: tile[jj] = jj < n ? scale * src row jj : 0
          for (int64_t jj = 0; jj < kPadLanes; ++jj) {
            const __m512 row = jj < n ? _mm512_mul_ps(_mm512_loadu_ps(src + (j0 + jj) * ld_src + c0), m)
                                      : _mm512_setzero_ps();
            _mm512_store_ps(tile[jj], row);
          }
          transpose16_u32(reinterpret_cast<uint32_t*>(dst + c0 * kBlock + j0), kBlock,
                          reinterpret_cast<const uint32_t*>(&tile[0][0]), kPadLanes);
          continue;
        }
      }
#endif
      for (int64_t jj = 0; jj < n; ++jj) {
        const T* row = src + (j0 + jj) * ld_src + c0;
        // Scalar math: tile[jj] = scale * row
#pragma omp simd
        for (int64_t cc = 0; cc < w; ++cc) tile[jj][cc] = scale * to_f32(row[cc]);
      }
      for (int64_t jj = n; jj < kPadLanes; ++jj) std::memset(tile[jj], 0, sizeof(tile[jj]));
      for (int64_t cc = 0; cc < w; ++cc) {
        float col[kPadLanes];
        for (int64_t jj = 0; jj < kPadLanes; ++jj) col[jj] = tile[jj][cc];
        std::memcpy(dst + (c0 + cc) * kBlock + j0, col, sizeof(col));
      }
    }
  }
}

// Where the key and value rows of (b, token s, kv head g) live, and so where their gradients go
// (dk, dk_shared and dv mirror k, k_shared and v). Plain attention: k [B, S, Hkv, Dqk] and
// v [B, S, Hkv, Dv]. MLA (mla_attention_*): a key's first k_width = Dn dims are the head's slice of
// kv [B, S, H, Dn + Dv] and its last Dqk - k_width = Dr dims the rope key k_shared [B, S, 1, Dr]
// that every head shares; the value is the rest of the head's slice of kv. Reading them there
// saves assembling per-head keys and values in memory (and the backward's split of their gradients).
template <class T>
struct KvRows {
  const T* k;
  int64_t k_tok, k_head, k_width;  // elements between tokens, between heads; dims taken per head
  const T* k_shared;               // null: the key is k's k_width = Dqk dims alone
  const T* v;
  int64_t v_tok, v_head;
  const T* key(const AttentionParams& d, int64_t b, int64_t s, int64_t g) const {
    return k + (b * d.S + s) * k_tok + g * k_head;
  }
  const T* key_tail(const AttentionParams& d, int64_t b, int64_t s) const {
    return k_shared + (b * d.S + s) * (d.Dqk - k_width);
  }
  const T* value(const AttentionParams& d, int64_t b, int64_t s, int64_t g) const {
    return v + (b * d.S + s) * v_tok + g * v_head;
  }
};

template <class T>
KvRows<T> plain_kv(const T* k, const T* v, const AttentionParams& d) {
  return {k, d.Hkv * d.Dqk, d.Dqk, d.Dqk, nullptr, v, d.Hkv * d.Dv, d.Dv};
}

template <class T>
KvRows<T> mla_kv(const T* kv, const T* k_rope, int64_t nope_dim, const AttentionParams& d) {
  const int64_t width = nope_dim + d.Dv;  // kv's last dim
  return {kv, d.H * width, width, nope_dim, k_rope, kv + nope_dim, d.H * width, width};
}

// Key rows [row0, row0 + rows) of (b, g) as f32 into dst (rows ld_dst apart, zero past Dqk).
template <class T>
void pack_key_rows(float* dst, int64_t ld_dst, const KvRows<T>& kv, const AttentionParams& d, int64_t b, int64_t g,
                   int64_t row0, int64_t rows) {
  pack_rows(dst, ld_dst, kv.key(d, b, row0, g), kv.k_tok, rows, kv.k_width, 1.0f);
  if (!kv.k_shared) return;
  const int64_t tail = d.Dqk - kv.k_width;
  for (int64_t j = 0; j < rows; ++j) {
    const T* src = kv.key_tail(d, b, row0 + j);
    float* out = dst + j * ld_dst + kv.k_width;
    // Scalar math: out = the shared key tail, as f32
#pragma omp simd
    for (int64_t c = 0; c < tail; ++c) out[c] = to_f32(src[c]);
  }
}

// Keys (unless kp is null) and values of every (b, kv head) as f32 rows, packed once (in
// parallel, padding included, so the buffers need no serial zero-fill) and shared by all query
// heads of the group: kp [B, Hkv, s_pad, dqk_pad], vp [B, Hkv, s_pad, dv_pad]. Rows past S are
// never read: every product over keys stops at the last valid key.
template <class T>
void pack_kv(float* kp, float* vp, const KvRows<T>& kv, const AttentionParams& d, const Plan& p) {
  const int64_t items = d.B * d.Hkv * p.nblk;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < items; ++t) {
    const int64_t blk = t % p.nblk, bg = t / p.nblk, b = bg / d.Hkv, g = bg % d.Hkv;
    const int64_t row0 = blk * kBlock, rows = min_i64(kBlock, d.S - row0);
    if (kp) pack_key_rows(kp + (bg * p.s_pad + row0) * p.dqk_pad, p.dqk_pad, kv, d, b, g, row0, rows);
    pack_rows(vp + (bg * p.s_pad + row0) * p.dv_pad, p.dv_pad, kv.value(d, b, row0, g), kv.v_tok, rows, d.Dv, 1.0f);
  }
}

// Causal mask of a diagonal tile held transposed (key j major, query i minor): scores with
// j > i become -inf, so exp gives 0.
void mask_diagonal(float* st, int64_t cols) {  // st [kBlock, kBlock]
  for (int64_t j = 1; j < cols; ++j) {
    for (int64_t i = 0; i < j; ++i) st[j * kBlock + i] = -INFINITY;
  }
}

// out[c] += sum_h part[h * stride + c] for h < heads in order, c < width; sum [width] is scratch.
template <class T>
void add_group_sum(T* out, float* sum, const float* part, int64_t stride, int64_t heads, int64_t width,
                   bool accumulate = true) {
  std::memcpy(sum, part, size_t(width) * sizeof(float));
  for (int64_t h = 1; h < heads; ++h) {
    const float* x = part + h * stride;
    // Scalar math: sum += part[h]
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) sum[c] += x[c];
  }
  // Scalar math: out = (accumulate ? out : 0) + sum
#pragma omp simd
  for (int64_t c = 0; c < width; ++c) out[c] = from_f32<T>(accumulate ? to_f32(out[c]) + sum[c] : sum[c]);
}


// dk, dv += the sum over each GQA group's heads of their per-head partials dk_part [B, H, S, Dqk]
// and dv_part [B, H, S, Dv], in head order. Called inside a parallel region (orphaned omp for).
template <class T>
void add_kv_partials(T* dk, T* dv, const float* dk_part, const float* dv_part, const AttentionParams& d,
                     const Plan& p) {
  Scratch<float> row_sum(p.dqk_pad > p.dv_pad ? p.dqk_pad : p.dv_pad, ScratchInit::zeroed);
#pragma omp for schedule(static)
  for (int64_t bs = 0; bs < d.B * d.S; ++bs) {
    const int64_t b = bs / d.S, i = bs % d.S;
    for (int64_t g = 0; g < d.Hkv; ++g) {
      add_group_sum(dk + (bs * d.Hkv + g) * d.Dqk, row_sum.data(),
                    dk_part + ((b * d.H + g * p.group) * d.S + i) * d.Dqk, d.S * d.Dqk, p.group, d.Dqk);
      add_group_sum(dv + (bs * d.Hkv + g) * d.Dv, row_sum.data(),
                    dv_part + ((b * d.H + g * p.group) * d.S + i) * d.Dv, d.S * d.Dv, p.group, d.Dv);
    }
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// ---- bf16 pairs -------------------------------------------------------------------------------
// bf16 products run on bf16 pairs with f32 accumulation instead of widening to f32: on AMX tiles
// (TDPBF16PS) or, without AMX, in VDPBF16PS register tiles reading the same operand layouts
// (pairs_block; the notes below on tiles are about AMX). kBlock-row blocks as in the f32 path, but
// scores are held queries by keys, so the products read query rows, P and dS straight as A
// operands. Keys and values are packed once per call and (b, kv head) into the B layouts
// (cpu/amx.h), shared by the group's query heads. Softmax, P and dS are f32 vector work in base 2
// (exp2_16_operand); P and dS are rounded to bf16 as tile operands. Every block is computed whole
// (tiles of 16 x 16): buffers are zero-padded past S, and masked or padding entries of P and dS are
// exactly 0 where they could reach a valid output. The products with a running f32 sum (o, dq, dk,
// dv) take their k over two or more blocks per load and store of that sum's tiles, which otherwise
// cost as much as the products themselves.

// Two packed blocks: the keys per step of the pair forward's key loop and the queries per step of
// the pair backward's query loop (which starts its spans at each group of kGroupBlocks key blocks).
constexpr int64_t kSpan = 2 * kBlock;
// How far (base 2) a score may exceed the pair forward's stale running max before the max moves.
constexpr float kLazyMax = 8.0f;
static_assert(kGroupBlocks % (kSpan / kBlock) == 0, "query spans must start at a key group's first block");

// Causal keep mask of query row i over the 16 keys starting at j0 (both counted from the same
// origin; j0 + 15 <= i keeps all, j0 > i none): keys j <= i.
TITAN_INLINE __mmask16 causal_keep(int64_t i, int64_t j0) {
  const int64_t n = i - j0 + 1;
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Prefetches rows [0, n) of `width` elements each, ld elements apart, into L1. The row-strided
// passes over q, k, v, dO, o, dq, dk, dv ([.., S, H, D]: rows H D elements apart, 2 KiB at
// H D = 1024 in bf16, so two rows per 4 KiB page) defeat the hardware prefetchers, which follow
// streams within a page; without this the backward's O(S D) loops over o and dq alone stalled
// on memory for ~10% of its time.
template <class T>
TITAN_INLINE void prefetch_rows(const T* p, int64_t ld, int64_t n, int64_t width) {
  for (int64_t r = 0; r < n; ++r) {
    const char* row = reinterpret_cast<const char*>(p + r * ld);
    for (int64_t b = 0; b < width * int64_t(sizeof(T)); b += 64) __builtin_prefetch(row + b);
  }
}

// The 16 x 16 block of 32-bit words at src (rows ld_src words apart; rows n and later read as 0,
// n <= 0 giving all zeros) transposed into dst (rows dst_ld words apart), through an L1 copy
// when the block is partial. In shuffles (transpose16_u32): a 16-lane gather per row costs
// several times as much, and these transposes pack all of k and v per call.
void transpose_words16(uint32_t* dst, int64_t dst_ld, const uint32_t* src, int64_t ld_src, int64_t n) {
  if (n >= 16) return transpose16_u32(dst, dst_ld, src, ld_src);
  alignas(64) uint32_t blk[16 * 16];
  // Scalar math: blk[r] = r < n ? src row r : 0
  for (int64_t r = 0; r < 16; ++r) {
    const __m512i row = r < n ? _mm512_loadu_si512(src + r * ld_src) : _mm512_setzero_si512();
    _mm512_store_si512(blk + r * 16, row);
  }
  transpose16_u32(dst, dst_ld, blk, 16);
}

// One block of rows as a B operand whose columns are those rows, VNNI along the row: dst[c2][j] =
// (src_j[2 c2], src_j[2 c2 + 1]) for j < rows, 0 for rows <= j < kBlock. dst [width / 2, kBlock]:
// a 32-bit transpose (ld_src even and width a multiple of 32, so the pairs are aligned words).
void pack_block_col_pairs(uint32_t* dst, const bf16* src, int64_t ld_src, int64_t rows, int64_t width) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(src);
  for (int64_t j0 = 0; j0 < kBlock; j0 += 16) {
    for (int64_t c0 = 0; c0 < width / 2; c0 += 16) {
      transpose_words16(dst + c0 * kBlock + j0, kBlock, words + j0 * (ld_src / 2) + c0, ld_src / 2, rows - j0);
    }
  }
}

// One block of rows as a B operand whose k runs down the rows: dst[j2][c] = (src_{2 j2}[c],
// src_{2 j2 + 1}[c]), rows past `rows` zero. dst [kBlock / 2, width].
void pack_block_row_pairs(uint32_t* dst, const bf16* src, int64_t ld_src, int64_t rows, int64_t width) {
  for (int64_t j2 = 0; j2 < kBlock / 2; ++j2) {
    uint32_t* out = dst + j2 * width;
    if (2 * j2 >= rows) {
      std::memset(out, 0, size_t(width) * sizeof(uint32_t));
      continue;
    }
    const bf16* r0 = src + 2 * j2 * ld_src;
    pack_row_pair(out, r0, 2 * j2 + 1 < rows ? r0 + ld_src : nullptr, width);
  }
}

// One block of rows copied as an A operand, dst [kBlock, width], rows past `rows` zero.
void pack_block_rows(bf16* dst, const bf16* src, int64_t ld_src, int64_t rows, int64_t width) {
  for (int64_t j = 0; j < kBlock; ++j) {
    if (j < rows) {
      std::memcpy(dst + j * width, src + j * ld_src, size_t(width) * sizeof(bf16));
    } else {
      std::memset(dst + j * width, 0, size_t(width) * sizeof(bf16));
    }
  }
}

// One block of rows transposed, dst[c * ld_dst + j] = src_j[c] for j < kBlock (0 past `rows`):
// the A operand whose k runs along the rows (q^T, dO^T). Per 16 rows and 16 column pairs, one
// 32-bit transpose of the pairs, each transposed row split into two destination rows by
// narrowing its low and high halves. width a multiple of 32.
void pack_block_transposed(bf16* dst, int64_t ld_dst, const bf16* src, int64_t ld_src, int64_t rows,
                           int64_t width) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(src);
  alignas(64) uint32_t blk[16 * 16];  // [16 column pairs, 16 rows]
  for (int64_t j0 = 0; j0 < kBlock; j0 += 16) {
    for (int64_t c0 = 0; c0 < width / 2; c0 += 16) {
      transpose_words16(blk, 16, words + j0 * (ld_src / 2) + c0, ld_src / 2, rows - j0);
      // Scalar math: out row 2 (c0 + r) = low halves (bf16) of the words of blk[r], row 2 (c0 + r) + 1 = high halves
      for (int64_t r = 0; r < 16; ++r) {
        const __m512i w = _mm512_load_si512(blk + r * 16);
        bf16* out = dst + 2 * (c0 + r) * ld_dst + j0;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(w));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + ld_dst), _mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
      }
    }
  }
}

// dst[j][c] = src[c][j] for j < rows, c < width: a [width, kBlock] f32 block (dk^T, dv^T) back to
// rows, 16 x 16 transposes through an L1 block. width a multiple of 16.
void unpack_block_transposed(float* dst, int64_t ld_dst, const float* src, int64_t rows, int64_t width) {
  alignas(64) uint32_t blk[16 * 16];  // [16 rows, 16 columns]
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t n = min_i64(16, rows - j0);
    for (int64_t c0 = 0; c0 < width; c0 += 16) {
      transpose16_u32(blk, 16, reinterpret_cast<const uint32_t*>(src + c0 * kBlock + j0), kBlock);
      for (int64_t r = 0; r < n; ++r) std::memcpy(dst + (j0 + r) * ld_dst + c0, blk + r * 16, 64);
    }
  }
}

// dst row j += src[:, j] (bf16 rows ld_dst apart, f32 sum rounded once) for j < rows: MHA's dk and
// dv, which one query head owns alone, straight from its dk^T, dv^T block. width a multiple of 16.
void add_block_transposed(bf16* dst, int64_t ld_dst, const float* src, int64_t rows, int64_t width) {
  alignas(64) uint32_t blk[16 * 16];  // [16 rows, 16 columns]
  prefetch_rows(dst, ld_dst, min_i64(16, rows), width);
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t n = min_i64(16, rows - j0);
    if (j0 + 16 < rows) prefetch_rows(dst + (j0 + 16) * ld_dst, ld_dst, min_i64(16, rows - j0 - 16), width);
    for (int64_t c0 = 0; c0 < width; c0 += 16) {
      transpose16_u32(blk, 16, reinterpret_cast<const uint32_t*>(src + c0 * kBlock + j0), kBlock);
      // Scalar math: out row j0 + r = bf16(out + blk[r])
      for (int64_t r = 0; r < n; ++r) {
        __m256i* out = reinterpret_cast<__m256i*>(dst + (j0 + r) * ld_dst + c0);
        const __m512 sum = _mm512_add_ps(_mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(out)),
                                         _mm512_castsi512_ps(_mm512_load_si512(blk + r * 16)));
        _mm256_storeu_si256(out, (__m256i)_mm512_cvtneps_pbh(sum));
      }
    }
  }
}

// The packed keys and values of every (b, kv head), block by block, in parallel:
// kd [B, Hkv, nblk, Dqk/2, kBlock] (B of q k^T), and when the pointers are given
// vd [.., Dv/2, kBlock] (B of dO v^T), kp [.., kBlock/2, Dqk] (B of dS k), vp [.., kBlock/2, Dv] (B of P v).
void pack_kv_amx(uint32_t* kd, uint32_t* vd, uint32_t* kp, uint32_t* vp, const bf16* k, const bf16* v,
                 const AttentionParams& d, const Plan& p) {
  const int64_t items = d.B * d.Hkv * p.nblk;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < items; ++t) {
    const int64_t blk = t % p.nblk, bg = t / p.nblk, b = bg / d.Hkv, g = bg % d.Hkv;
    const int64_t row0 = blk * kBlock, rows = min_i64(kBlock, d.S - row0);
    const bf16* kt = k + ((b * d.S + row0) * d.Hkv + g) * d.Dqk;
    const bf16* vt = v + ((b * d.S + row0) * d.Hkv + g) * d.Dv;
    if (rows == kBlock && row0 + 2 * kBlock <= d.S) {  // the next block of this (b, kv head), usually this thread's next item
      prefetch_rows(kt + kBlock * d.Hkv * d.Dqk, d.Hkv * d.Dqk, kBlock, d.Dqk);
      prefetch_rows(vt + kBlock * d.Hkv * d.Dv, d.Hkv * d.Dv, kBlock, d.Dv);
    }
    pack_block_col_pairs(kd + t * d.Dqk * kBlock / 2, kt, d.Hkv * d.Dqk, rows, d.Dqk);
    if (vd) pack_block_col_pairs(vd + t * d.Dv * kBlock / 2, vt, d.Hkv * d.Dv, rows, d.Dv);
    if (kp) pack_block_row_pairs(kp + t * d.Dqk * kBlock / 2, kt, d.Hkv * d.Dqk, rows, d.Dqk);
    if (vp) pack_block_row_pairs(vp + t * d.Dv * kBlock / 2, vt, d.Hkv * d.Dv, rows, d.Dv);
  }
}

// c [rows, width] (+)= a [rows, K] (bf16 rows, a_ld elements apart) x b [K/2, width] (VNNI rows
// of k pairs), K = 32 * chunks, in 32 x 32 blocks of 2 x 2 tiles (amx_block_2x2: one tile load
// per product); rows and width are multiples of 32 here (kBlock, kSpan, and Dqk, Dv by pairs_fit).
template <bool kAccumulate>
void amx_block(float* c, int64_t ldc, int64_t rows, const bf16* a, int64_t a_ld, const uint32_t* b, int64_t width,
               int64_t chunks) {
  for (int64_t r0 = 0; r0 < rows; r0 += 32) {
    for (int64_t c0 = 0; c0 < width; c0 += 32) {
      amx_block_2x2<kAccumulate>(c + r0 * ldc + c0, ldc * 4, 16 * ldc * 4, reinterpret_cast<const char*>(a + r0 * a_ld),
                                 a_ld * 2, 64, 16 * a_ld * 2, reinterpret_cast<const char*>(b + c0), width * 4,
                                 16 * width * 4, chunks);
    }
  }
}

// amx_block's product on VDPBF16PS register tiles for CPUs without AMX: the same operands through
// the f32 path's gemm, with a's rows read as k pairs (E = uint32_t).
template <bool kAccumulate>
void pairs_block(float* c, int64_t ldc, int64_t rows, const bf16* a, int64_t a_ld, const uint32_t* b, int64_t width,
                 int64_t chunks) {
  constexpr TileStore kStore = kAccumulate ? TileStore::accumulate : TileStore::write;
  gemm<Tiles, kStore>(c, ldc, reinterpret_cast<const uint32_t*>(a), a_ld / 2, int64_t(1), b, width, rows, width,
                      16 * chunks);
}

// The bf16 pair products of the forward and backward below: on AMX tiles (kAmx) or VDPBF16PS.
template <bool kAmx, bool kAccumulate>
TITAN_INLINE void pair_product(float* c, int64_t ldc, int64_t rows, const bf16* a, int64_t a_ld, const uint32_t* b,
                               int64_t width, int64_t chunks) {
  if constexpr (kAmx) {
    amx_block<kAccumulate>(c, ldc, rows, a, a_ld, b, width, chunks);
  } else {
    pairs_block<kAccumulate>(c, ldc, rows, a, a_ld, b, width, chunks);
  }
}

// The forward: one work item per (b, head, query block). The block's
// queries stay resident ([kBlock, Dqk] bf16, the running o in f32) while key blocks stream past:
// S = q k^T and o += P v on tiles, the online softmax in vectors between them.
template <bool kAmx>
void forward_bf16_pairs(bf16* o, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionParams& d) {
  const Plan p = make_plan(d);
  const int64_t kd_blk = d.Dqk * kBlock / 2, vp_blk = d.Dv * kBlock / 2;  // uint32 per packed block
  Scratch<uint32_t> kd(d.B * d.Hkv * p.nblk * kd_blk);  // [B, Hkv, nblk, Dqk/2, kBlock]
  Scratch<uint32_t> vp(d.B * d.Hkv * p.nblk * vp_blk);  // [B, Hkv, nblk, kBlock/2, Dv]
  pack_kv_amx(kd.data(), nullptr, nullptr, vp.data(), k, v, d, p);

  const float c = float(d.scale * 1.4426950408889634);  // exp(scale s - m) = 2^(c s - m2)
  const int64_t heads = d.B * d.H, items = heads * p.nblk;
#pragma omp parallel
  {
    if constexpr (kAmx) amx_configure();
    Scratch<bf16> qblk(kBlock * d.Dqk, ScratchInit::zeroed);    // [kBlock, Dqk] the block's queries
    Scratch<float> st(kBlock * kSpan, ScratchInit::zeroed);     // [kBlock queries, kSpan keys] scores
    Scratch<bf16> pb(kBlock * kSpan, ScratchInit::zeroed);      // [kBlock, kSpan] P, A of P v
    Scratch<float> oacc(kBlock * d.Dv, ScratchInit::zeroed);    // [kBlock, Dv] unnormalized o
    Scratch<float> m(kBlock, ScratchInit::zeroed);        // [kBlock] running max (base 2), possibly stale
    Scratch<float> l(kBlock * 16, ScratchInit::zeroed);   // [kBlock, 16] running sums, 16 lanes per row
    const __m512 cv = _mm512_set1_ps(c);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < items; ++t) {
      // Head by head (a GQA group's heads in turn), so the threads share one kv head's packed
      // blocks while they are hot in cache; within a head the longest rows first, so the dynamic
      // schedule ends on short items.
      const int64_t bh = t / p.nblk, qb = p.nblk - 1 - t % p.nblk, b = bh / d.H, h = bh % d.H;
      const int64_t bg = b * d.Hkv + h / p.group, row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
      pack_block_rows(qblk.data(), q + ((b * d.S + row0) * d.H + h) * d.Dqk, d.H * d.Dqk, rows, d.Dqk);
      for (int64_t i = 0; i < kBlock; ++i) m.data()[i] = -INFINITY;
      std::memset(l.data(), 0, size_t(kBlock * 16) * sizeof(float));
      // Key blocks two at a time (one at the diagonal when qb + 1 - kb is odd): the span's P v
      // product then runs 4 k chunks per load and store of its o tiles.
      for (int64_t kb = 0, nk = 0; kb <= qb; kb += nk) {
        nk = min_i64(kSpan / kBlock, qb + 1 - kb);
        for (int64_t x = 0; x < nk; ++x) {
          pair_product<kAmx, false>(st.data() + x * kBlock, kSpan, kBlock, qblk.data(), d.Dqk,
                           kd.data() + (bg * p.nblk + kb + x) * kd_blk, kBlock, d.Dqk / 32);
        }
        // Per query row: P = 2^(c s - m) rounded to bf16 and its sum, with m the running max kept
        // stale while no score exceeds it by more than kLazyMax (P then stays below 2^kLazyMax,
        // harmless in f32 and bf16): the common case needs no horizontal max and no rescale of o,
        // and t = c s - m (one FMA) serves both the check and exp2_16_operand. Sums stay 16
        // lanes wide until the end. Rows past S see zero scores and stay finite; masked keys get
        // P = 0 exactly. The span's vector count is a constant (nv_c) so a row stays in
        // registers; masks are computed only where the span reaches the diagonal.
        const int64_t key0 = (kb - qb) * kBlock;  // the span's first key relative to the block's first query
        const auto softmax_rows = [&](auto nv_c, auto masked_c) {
          constexpr int64_t nv = decltype(nv_c)::value;      // 16-key vectors in the span
          constexpr bool masked = decltype(masked_c)::value;  // the span holds the diagonal block
          // Two rows per step: their dependency chains interleave.
          for (int64_t i0 = 0; i0 < kBlock; i0 += 2) {
            __m512 tv[2][nv];
            __mmask16 keep[2][nv];
            float mi[2];
            for (int rr = 0; rr < 2; ++rr) {
              const float* srow = st.data() + (i0 + rr) * kSpan;
              mi[rr] = m.data()[i0 + rr];
              const __m512 mv = _mm512_set1_ps(mi[rr]), limit = _mm512_set1_ps(kLazyMax);
              __mmask16 over = 0;
              // Scalar math: t = c s - m (base 2, stale max m); over = any kept t > kLazyMax
              for (int64_t vi = 0; vi < nv; ++vi) {
                keep[rr][vi] = masked ? causal_keep(i0 + rr, key0 + 16 * vi) : __mmask16(0xffff);
                tv[rr][vi] = _mm512_fmsub_ps(_mm512_loadu_ps(srow + 16 * vi), cv, mv);
                over |= _mm512_mask_cmp_ps_mask(keep[rr][vi], tv[rr][vi], limit, _CMP_GT_OQ);
              }
              if (over) {  // a new max (always in the first span, where m is -inf and t +inf)
                __m512 mx = _mm512_set1_ps(-INFINITY);
                // Scalar math: m = max(m, max over kept keys of c s); t = c s - m
                for (int64_t vi = 0; vi < nv; ++vi) {
                  mx = _mm512_mask_max_ps(mx, keep[rr][vi], mx, _mm512_mul_ps(_mm512_loadu_ps(srow + 16 * vi), cv));
                }
                const float mb = _mm512_reduce_max_ps(mx);
                mi[rr] = mi[rr] > mb ? mi[rr] : mb;
                const __m512 mn = _mm512_set1_ps(mi[rr]);
                for (int64_t vi = 0; vi < nv; ++vi) tv[rr][vi] = _mm512_fmsub_ps(_mm512_loadu_ps(srow + 16 * vi), cv, mn);
              }
            }
            for (int rr = 0; rr < 2; ++rr) {
              const int64_t i = i0 + rr;
              __m512 sum = _mm512_setzero_ps();
              // Scalar math: P = kept ? 2^t : 0, stored as bf16; sum += P
              for (int64_t vi = 0; vi < nv; vi += 2) {  // two vectors of P per bf16 store
                const __m512 p0 = exp2_16_operand(tv[rr][vi], keep[rr][vi]);
                const __m512 p1 = exp2_16_operand(tv[rr][vi + 1], keep[rr][vi + 1]);
                sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
                _mm512_storeu_si512(pb.data() + i * kSpan + 16 * vi, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
              }
              float* li = l.data() + i * 16;
              if (mi[rr] == m.data()[i]) {
                _mm512_storeu_ps(li, _mm512_add_ps(_mm512_loadu_ps(li), sum));
                continue;
              }
              // The max moved: alpha = 2^(m_old - m_new) rescales the old sums and o (0 at first).
              const __m512 av = _mm512_set1_ps(std::exp2(m.data()[i] - mi[rr]));
              _mm512_storeu_ps(li, _mm512_fmadd_ps(_mm512_loadu_ps(li), av, sum));
              m.data()[i] = mi[rr];
              if (kb == 0) continue;  // the first span's P v writes o rather than adding to it
              float* orow = oacc.data() + i * d.Dv;
              // Scalar math: o *= alpha
              for (int64_t col = 0; col < d.Dv; col += 16) {
                _mm512_storeu_ps(orow + col, _mm512_mul_ps(_mm512_loadu_ps(orow + col), av));
              }
            }
          }
        };
        using Full = std::integral_constant<int64_t, kSpan / 16>;
        using Half = std::integral_constant<int64_t, kBlock / 16>;
        if (kb + nk - 1 < qb) {
          softmax_rows(Full{}, std::false_type{});  // a span short of the diagonal is always two blocks
        } else if (nk == 2) {
          softmax_rows(Full{}, std::true_type{});
        } else {
          softmax_rows(Half{}, std::true_type{});
        }
        // The span's value blocks lie back to back in vp: one B operand of nk * kBlock keys. The
        // first span writes o, so it needs no zero-fill (nor rescale) per item.
        const uint32_t* v_span = vp.data() + (bg * p.nblk + kb) * vp_blk;
        if (kb == 0) {
          pair_product<kAmx, false>(oacc.data(), d.Dv, kBlock, pb.data(), kSpan, v_span, d.Dv, nk * kBlock / 32);
        } else {
          pair_product<kAmx, true>(oacc.data(), d.Dv, kBlock, pb.data(), kSpan, v_span, d.Dv, nk * kBlock / 32);
        }
      }
      for (int64_t i = 0; i < rows; ++i) {
        const float sum = _mm512_reduce_add_ps(_mm512_loadu_ps(l.data() + i * 16));
        const __m512 inv = _mm512_set1_ps(1.0f / sum);
        const float* orow = oacc.data() + i * d.Dv;
        bf16* out = o + ((b * d.S + row0 + i) * d.H + h) * d.Dv;
        // Scalar math: out = bf16(o / sum)
        for (int64_t col = 0; col < d.Dv; col += 16) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + col),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(orow + col), inv)));
        }
        lse[bh * d.S + row0 + i] = (m.data()[i] + std::log2(sum)) * 0.6931471805599453f;
      }
    }
    if constexpr (kAmx) _tile_release();
  }
}

// The backward: one work item per (b, head), as in the f32 path (groups of kGroupBlocks key
// blocks outer, query blocks inner, per-head dk and dv partials summed over the GQA group after;
// without GQA each head adds its dk and dv straight into the outputs).
// Per query span (kSpan rows) and key block, on tiles: S = q k^T and dP = dO v^T (queries by
// keys), then dv^T += dO^T P and dk^T += q^T dS (held transposed, [D, keys]: P and dS become B
// operands by pairing two query rows, no transpose); dq += dS k once per span and key group. P
// from lse and dS = scale P (dP - D) in vectors between them.
template <bool kAmx>
void backward_bf16_pairs(bf16* dq, bf16* dk, bf16* dv, const float* lse, const bf16* dout, const bf16* q,
                       const bf16* k, const bf16* v, const bf16* o, const AttentionParams& d) {
  const Plan p = make_plan(d);
  const int64_t kblk = d.Dqk * kBlock / 2, vblk = d.Dv * kBlock / 2;  // uint32 per packed block
  const int64_t kv_blocks = d.B * d.Hkv * p.nblk;
  Scratch<uint32_t> kd(kv_blocks * kblk);  // [B, Hkv, nblk, Dqk/2, kBlock] B of q k^T
  Scratch<uint32_t> vd(kv_blocks * vblk);  // [B, Hkv, nblk, Dv/2, kBlock] B of dO v^T
  Scratch<uint32_t> kp(kv_blocks * kblk);  // [B, Hkv, nblk, kBlock/2, Dqk] B of dS k
  pack_kv_amx(kd.data(), vd.data(), kp.data(), nullptr, k, v, d, p);
  // GQA: per-head shares of dk and dv, summed over each group afterwards. MHA adds into dk, dv.
  const bool mha = p.group == 1;
  Scratch<float> dk_part(mha ? 0 : d.B * d.H * d.S * d.Dqk);  // [B, H, S, Dqk] this head's share of dk
  Scratch<float> dv_part(mha ? 0 : d.B * d.H * d.S * d.Dv);   // [B, H, S, Dv]

  const float c = float(d.scale * 1.4426950408889634), scale = float(d.scale);
  // Query-side rows padded to whole spans (zero past S). Transposed rows one cache line longer:
  // at S = 2048 a power-of-two stride would put all 16 rows of an A tile in one L1 set.
  const int64_t s_span = round_up(p.s_pad, kSpan), ldt = s_span + 32;
  const int64_t heads = d.B * d.H;
  const int threads = heads < omp_get_max_threads() ? int(heads) : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    if constexpr (kAmx) amx_configure();
    Scratch<bf16> qr(s_span * d.Dqk, ScratchInit::zeroed);     // [s_span, Dqk] q rows: A of q k^T
    Scratch<bf16> dor(s_span * d.Dv, ScratchInit::zeroed);     // [s_span, Dv] dO rows: A of dO v^T
    Scratch<bf16> qt(d.Dqk * ldt, ScratchInit::zeroed);        // [Dqk, ldt] q^T: A of dk^T
    Scratch<bf16> dot(d.Dv * ldt, ScratchInit::zeroed);        // [Dv, ldt] dO^T: A of dv^T
    Scratch<float> dq_acc(s_span * d.Dqk, ScratchInit::zeroed);  // [s_span, Dqk]
    // [s_span] base-2 lse and D_i, 0 past S
    Scratch<float> lse2(s_span, ScratchInit::zeroed), delta(s_span, ScratchInit::zeroed);
    Scratch<float> st(kSpan * kBlock, ScratchInit::zeroed);    // [kSpan queries, kBlock keys] S
    Scratch<float> dpt(kSpan * kBlock, ScratchInit::zeroed);   // [kSpan, kBlock] dP
    // [kSpan, kGroupBlocks * kBlock] scale dS: A of dS k
    Scratch<bf16> dsb(kSpan * kGroupBlocks * kBlock, ScratchInit::zeroed);
    Scratch<uint32_t> pp(kSpan * kBlock / 2, ScratchInit::zeroed);   // [kSpan/2 query pairs, kBlock keys] P: B of dO^T P
    Scratch<uint32_t> dsp(kSpan * kBlock / 2, ScratchInit::zeroed);  // [kSpan/2, kBlock] scale dS: B of q^T dS
    Scratch<float> dkt(kGroupBlocks * d.Dqk * kBlock, ScratchInit::zeroed);  // [kGroupBlocks, Dqk, kBlock] dk^T
    Scratch<float> dvt(kGroupBlocks * d.Dv * kBlock, ScratchInit::zeroed);   // [kGroupBlocks, Dv, kBlock] dv^T
    const __m512 cv = _mm512_set1_ps(c), sv = _mm512_set1_ps(scale);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H, bg = b * d.Hkv + h / p.group;
      const bf16* q_h = q + (b * d.S * d.H + h) * d.Dqk;     // row i at q_h + i * H * Dqk
      const bf16* do_h = dout + (b * d.S * d.H + h) * d.Dv;  // row i at do_h + i * H * Dv
      for (int64_t qb = 0; qb < p.nblk; ++qb) {
        const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        if (qb + 1 < p.nblk) {  // the next block's rows, while this one is packed
          const int64_t next = min_i64(kBlock, d.S - row0 - kBlock);
          prefetch_rows(q_h + (row0 + kBlock) * d.H * d.Dqk, d.H * d.Dqk, next, d.Dqk);
          prefetch_rows(do_h + (row0 + kBlock) * d.H * d.Dv, d.H * d.Dv, next, d.Dv);
        }
        pack_block_rows(qr.data() + row0 * d.Dqk, q_h + row0 * d.H * d.Dqk, d.H * d.Dqk, rows, d.Dqk);
        pack_block_rows(dor.data() + row0 * d.Dv, do_h + row0 * d.H * d.Dv, d.H * d.Dv, rows, d.Dv);
        pack_block_transposed(qt.data() + row0, ldt, q_h + row0 * d.H * d.Dqk, d.H * d.Dqk, rows, d.Dqk);
        pack_block_transposed(dot.data() + row0, ldt, do_h + row0 * d.H * d.Dv, d.H * d.Dv, rows, d.Dv);
      }
      constexpr int64_t kAhead = 16;  // rows prefetched ahead in the o and dq passes
      prefetch_rows(o + (b * d.S * d.H + h) * d.Dv, d.H * d.Dv, min_i64(kAhead, d.S), d.Dv);
      for (int64_t i = 0; i < d.S; ++i) {
        const bf16* orow = o + ((b * d.S + i) * d.H + h) * d.Dv;
        if (i + kAhead < d.S) prefetch_rows(orow + kAhead * d.H * d.Dv, 0, 1, d.Dv);
        const bf16* dorow = dor.data() + i * d.Dv;
        float sum = 0;
        // Scalar math: D_i = sum over c of dO[i, c] o[i, c]
#pragma omp simd reduction(+ : sum)
        for (int64_t col = 0; col < d.Dv; ++col) sum += to_f32(dorow[col]) * to_f32(orow[col]);
        delta.data()[i] = sum;
        lse2.data()[i] = lse[bh * d.S + i] * 1.4426950408889634f;
      }

      for (int64_t kb0 = 0; kb0 < p.nblk; kb0 += kGroupBlocks) {
        const int64_t kb_end = min_i64(p.nblk, kb0 + kGroupBlocks);
        // Query spans of two blocks (kGroupBlocks is even, so spans start at kb0): the dv^T and
        // dk^T products then run 4 k chunks per load and store of their tiles. A key block right
        // of the span's first block sees that half fully masked (P = dS = 0), computed anyway.
        for (int64_t qs = kb0; qs < p.nblk; qs += kSpan / kBlock) {
          const int64_t row0 = qs * kBlock;
          for (int64_t kb = kb0; kb < kb_end && kb <= qs + 1; ++kb) {
            const int64_t blk = bg * p.nblk + kb, key0 = kb * kBlock - row0;  // key0: relative to the span's first query
            pair_product<kAmx, false>(st.data(), kBlock, kSpan, qr.data() + row0 * d.Dqk, d.Dqk, kd.data() + blk * kblk,
                                      kBlock, d.Dqk / 32);
            pair_product<kAmx, false>(dpt.data(), kBlock, kSpan, dor.data() + row0 * d.Dv, d.Dv, vd.data() + blk * vblk,
                                      kBlock, d.Dv / 32);
            // P = 2^(c s - lse2) and scale dS = P (scale dP - scale D), two query rows at a time:
            // rows as dS's A operand, query pairs as P's and dS's B operands. Masked keys give
            // exact zeros; queries past S have zero dO, so their (finite) P and dS add nothing.
            const auto p_and_ds = [&](auto masked_c) {
              constexpr bool masked = decltype(masked_c)::value;  // the key block reaches the span's diagonal
              for (int64_t i = 0; i < kSpan; i += 2) {
                const __m512 l0 = _mm512_set1_ps(lse2.data()[row0 + i]), l1 = _mm512_set1_ps(lse2.data()[row0 + i + 1]);
                const __m512 d0 = _mm512_set1_ps(scale * delta.data()[row0 + i]);
                const __m512 d1 = _mm512_set1_ps(scale * delta.data()[row0 + i + 1]);
                // Scalar math: P = kept ? 2^(c s - lse2) : 0; scale dS = P (scale dP - scale D); dS in bf16 rows, P
                //   and dS as query pairs
                for (int vi = 0; vi < 4; ++vi) {
                  const int64_t e0 = i * kBlock + 16 * vi, e1 = e0 + kBlock;
                  const int64_t r0 = i * kGroupBlocks * kBlock + (kb - kb0) * kBlock + 16 * vi;  // in dsb
                  const int64_t r1 = r0 + kGroupBlocks * kBlock;
                  const __mmask16 keep0 = masked ? causal_keep(i, key0 + 16 * vi) : __mmask16(0xffff);
                  const __mmask16 keep1 = masked ? causal_keep(i + 1, key0 + 16 * vi) : __mmask16(0xffff);
                  const __m512 s0 = _mm512_loadu_ps(st.data() + e0), s1 = _mm512_loadu_ps(st.data() + e1);
                  const __m512 p0 = exp2_16_operand(_mm512_fmsub_ps(s0, cv, l0), keep0);
                  const __m512 p1 = exp2_16_operand(_mm512_fmsub_ps(s1, cv, l1), keep1);
                  const __m512 dp0 = _mm512_loadu_ps(dpt.data() + e0), dp1 = _mm512_loadu_ps(dpt.data() + e1);
                  const __m512 ds0 = _mm512_mul_ps(p0, _mm512_fmsub_ps(dp0, sv, d0));
                  const __m512 ds1 = _mm512_mul_ps(p1, _mm512_fmsub_ps(dp1, sv, d1));
                  const __m512i ds01 = (__m512i)_mm512_cvtne2ps_pbh(ds1, ds0);  // [ds0 | ds1] in bf16
                  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsb.data() + r0), _mm512_castsi512_si256(ds01));
                  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsb.data() + r1), _mm512_extracti64x4_epi64(ds01, 1));
                  const int64_t pair = (i / 2) * kBlock + 16 * vi;
                  _mm512_storeu_si512(pp.data() + pair, pack_pair_ps(p0, p1));
                  _mm512_storeu_si512(dsp.data() + pair, vnni_interleave(ds01));
                }
              }
            };
            if (kb >= qs) {
              p_and_ds(std::true_type{});
            } else {
              p_and_ds(std::false_type{});
            }
            // The first span that sees key block kb (qs = kb or kb - 1) writes its dv^T and dk^T,
            // the later ones add: no zero-fill per key group.
            const int64_t x = kb - kb0;
            float* dvt_x = dvt.data() + x * d.Dv * kBlock;   // [Dv, kBlock]
            float* dkt_x = dkt.data() + x * d.Dqk * kBlock;  // [Dqk, kBlock]
            if (qs <= kb) {
              pair_product<kAmx, false>(dvt_x, kBlock, d.Dv, dot.data() + row0, ldt, pp.data(), kBlock, kSpan / 32);
              pair_product<kAmx, false>(dkt_x, kBlock, d.Dqk, qt.data() + row0, ldt, dsp.data(), kBlock, kSpan / 32);
            } else {
              pair_product<kAmx, true>(dvt_x, kBlock, d.Dv, dot.data() + row0, ldt, pp.data(), kBlock, kSpan / 32);
              pair_product<kAmx, true>(dkt_x, kBlock, d.Dqk, qt.data() + row0, ldt, dsp.data(), kBlock, kSpan / 32);
            }
          }
          // dq += dS k over all the group's key blocks the span sees at once (their packed blocks
          // lie back to back in kp): 2 k chunks per visible block per load and store of dq's tiles.
          // The first key group visits every span first, so it writes dq: no zero-fill per head.
          const int64_t seen = min_i64(kb_end, qs + 2) - kb0;
          const uint32_t* k_group = kp.data() + (bg * p.nblk + kb0) * kblk;
          float* dq_span = dq_acc.data() + row0 * d.Dqk;  // [kSpan, Dqk]
          if (kb0 == 0) {
            pair_product<kAmx, false>(dq_span, d.Dqk, kSpan, dsb.data(), kGroupBlocks * kBlock, k_group, d.Dqk,
                                      seen * kBlock / 32);
          } else {
            pair_product<kAmx, true>(dq_span, d.Dqk, kSpan, dsb.data(), kGroupBlocks * kBlock, k_group, d.Dqk,
                                     seen * kBlock / 32);
          }
        }
        for (int64_t kb = kb0; kb < kb_end; ++kb) {
          const int64_t x = kb - kb0, col0 = kb * kBlock, cols = min_i64(kBlock, d.S - col0);
          if (mha) {
            add_block_transposed(dk + ((b * d.S + col0) * d.Hkv + h) * d.Dqk, d.Hkv * d.Dqk,
                                 dkt.data() + x * d.Dqk * kBlock, cols, d.Dqk);
            add_block_transposed(dv + ((b * d.S + col0) * d.Hkv + h) * d.Dv, d.Hkv * d.Dv,
                                 dvt.data() + x * d.Dv * kBlock, cols, d.Dv);
          } else {
            unpack_block_transposed(dk_part.data() + (bh * d.S + col0) * d.Dqk, d.Dqk,
                                    dkt.data() + x * d.Dqk * kBlock, cols, d.Dqk);
            unpack_block_transposed(dv_part.data() + (bh * d.S + col0) * d.Dv, d.Dv,
                                    dvt.data() + x * d.Dv * kBlock, cols, d.Dv);
          }
        }
      }
      prefetch_rows(dq + (b * d.S * d.H + h) * d.Dqk, d.H * d.Dqk, min_i64(kAhead, d.S), d.Dqk);
      for (int64_t i = 0; i < d.S; ++i) {
        bf16* out = dq + ((b * d.S + i) * d.H + h) * d.Dqk;
        if (i + kAhead < d.S) prefetch_rows(out + kAhead * d.H * d.Dqk, 0, 1, d.Dqk);
        const float* acc = dq_acc.data() + i * d.Dqk;
        // Scalar math: dq = bf16(dq + dq_acc)
#pragma omp simd
        for (int64_t col = 0; col < d.Dqk; ++col) out[col] = from_f32<bf16>(to_f32(out[col]) + acc[col]);
      }
    }
    if constexpr (kAmx) _tile_release();
    if (!mha) add_kv_partials(dk, dv, dk_part.data(), dv_part.data(), d, p);
  }
}

// Both head dims whole 32-element k chunks of a tile (Dqk for q k^T, Dv for dO v^T).
bool pairs_fit(const AttentionParams& d) { return d.Dqk % 32 == 0 && d.Dv % 32 == 0; }
#endif

}  // namespace

// ---- forward ----------------------------------------------------------------------------------
// Scores are computed transposed, S^T = k q^T (keys down, the block's queries across), so the
// softmax over keys is element-wise across rows: running max, exp and sum are plain vector ops
// with no horizontal reductions, and the P^T tile feeds o += P v as a transposed A operand.
namespace {
template <class T>
void forward_blocked(T* o, float* lse, const T* q, const KvRows<T>& kv, const AttentionParams& d) {
  const Plan p = make_plan(d);
  // f32 keys of a whole vector width are read in place: they are only the A operand of S^T = k q^T
  // (one broadcast per row and k step), where their row stride costs nothing, and packing them
  // would write and reread a copy of all keys. Values are a B operand and stay packed.
  // MLA's keys are read in place in two parts, the head's nope dims then the shared rope dims: the
  // second product continues the first's sums in k order, as gemm's own K chunks do.
  constexpr bool kF32 = std::is_same_v<T, float>;
  const bool keys_in_place = kF32 && (kv.k_shared || d.Dqk == p.dqk_pad);
  const int64_t k_main = keys_in_place ? kv.k_width : d.Dqk;  // key dims read through key_block
  Scratch<float> kp(keys_in_place ? 0 : d.B * d.Hkv * p.s_pad * p.dqk_pad);  // [B, Hkv, s_pad, dqk_pad]
  Scratch<float> vp(d.B * d.Hkv * p.s_pad * p.dv_pad);                        // [B, Hkv, s_pad, dv_pad]
  pack_kv<T>(keys_in_place ? nullptr : kp.data(), vp.data(), kv, d, p);
  const int64_t k_ld = keys_in_place ? kv.k_tok : p.dqk_pad;  // floats between key rows
  auto key_block = [&](int64_t b, int64_t bg, int64_t row0) -> const float* {  // [kBlock, k_ld]
    if constexpr (kF32) {
      if (keys_in_place) return kv.key(d, b, row0, bg % d.Hkv);
    }
    return kp.data() + (bg * p.s_pad + row0) * p.dqk_pad;
  };
  const int64_t tail = d.Dqk - k_main;  // the in-place shared dims: key_tail rows, tail floats apart
  auto tail_block = [&](int64_t b, int64_t row0) -> const float* {  // [kBlock, tail]
    if constexpr (kF32) {
      if (tail > 0) return kv.key_tail(d, b, row0);
    }
    return nullptr;
  };

  const float scale = float(d.scale);
  const int64_t heads = d.B * d.H, groups = (p.nblk + kGroupBlocks - 1) / kGroupBlocks, items = heads * groups;
#pragma omp parallel
  {
    // Per query block of the group: its state while the key blocks stream past.
    Scratch<float> qt(kGroupBlocks * d.Dqk * kBlock, ScratchInit::zeroed);       // [kGroupBlocks, Dqk, kBlock] scale * q^T
    Scratch<float> oacc(kGroupBlocks * kBlock * p.dv_pad, ScratchInit::zeroed);  // [kGroupBlocks, kBlock, dv_pad] unnormalized o
    Scratch<float> m(kGroupBlocks * kBlock, ScratchInit::zeroed), l(kGroupBlocks * kBlock, ScratchInit::zeroed);  // [kGroupBlocks, kBlock] running max, sum
    Scratch<float> st(kBlock * kBlock, ScratchInit::zeroed);                     // [kBlock keys, kBlock queries] scores, then P^T
    Scratch<float> alpha(kBlock, ScratchInit::zeroed);                           // [kBlock] rescale factor of the current key block
    // Items go head by head, so the threads share one head's packed k and v while they are hot
    // in cache rather than cycling through every head's. Within a head, causal work grows with
    // the query index: the last groups go first, so the dynamic schedule ends on small items.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < items; ++t) {
      const int64_t bh = t / groups, qg = groups - 1 - t % groups, b = bh / d.H, h = bh % d.H;
      const int64_t bg = b * d.Hkv + h / p.group;
      const int64_t qb0 = qg * kGroupBlocks, qb_end = min_i64(p.nblk, qb0 + kGroupBlocks);
      for (int64_t qb = qb0; qb < qb_end; ++qb) {
        const int64_t x = qb - qb0, row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        pack_transposed(qt.data() + x * d.Dqk * kBlock, q + ((b * d.S + row0) * d.H + h) * d.Dqk, d.H * d.Dqk, rows,
                        d.Dqk, scale);
        for (int64_t i = 0; i < kBlock; ++i) m.data()[x * kBlock + i] = -INFINITY, l.data()[x * kBlock + i] = 0;
        std::memset(oacc.data() + x * kBlock * p.dv_pad, 0, size_t(kBlock * p.dv_pad) * sizeof(float));
      }

      for (int64_t kb = 0; kb < qb_end; ++kb) {
        const float* kp_blk = key_block(b, bg, kb * kBlock);                        // [kBlock, k_ld]
        const float* vp_blk = vp.data() + (bg * p.s_pad + kb * kBlock) * p.dv_pad;  // [kBlock, dv_pad]
        for (int64_t qb = kb > qb0 ? kb : qb0; qb < qb_end; ++qb) {
          const int64_t x = qb - qb0, rows = min_i64(kBlock, d.S - qb * kBlock);
          float* m_x = m.data() + x * kBlock;                // [kBlock]
          float* l_x = l.data() + x * kBlock;                // [kBlock]
          float* oacc_x = oacc.data() + x * kBlock * p.dv_pad;  // [kBlock, dv_pad]
          const bool diagonal = kb == qb;
          const int64_t cols = diagonal ? rows : kBlock;  // keys past the diagonal or past S are skipped
          const float* qt_x = qt.data() + x * d.Dqk * kBlock;  // [Dqk, kBlock]
          const float* tail_blk = tail_block(b, kb * kBlock);  // [kBlock, tail]
          if (diagonal) {
            gemm_diagonal<Diagonal::queries_across, false>(st.data(), kBlock, kp_blk, k_ld, 1, qt_x, kBlock, cols,
                                                           kBlock, k_main);
            if (tail > 0) {
              gemm_diagonal<Diagonal::queries_across, true>(st.data(), kBlock, tail_blk, tail, 1,
                                                            qt_x + k_main * kBlock, kBlock, cols, kBlock, tail);
            }
            mask_diagonal(st.data(), cols);
          } else {
            gemm<Tiles, TileStore::write>(st.data(), kBlock, kp_blk, k_ld, 1, qt_x, kBlock, cols, kBlock, k_main);
            if (tail > 0) {
              gemm<Tiles, TileStore::accumulate>(st.data(), kBlock, tail_blk, tail, 1, qt_x + k_main * kBlock, kBlock,
                                                 cols, kBlock, tail);
            }
          }
          // Online softmax per query column: new max, rescale of the old sum (and of o below),
          // P^T = exp(S^T - max). Padding queries past S compute finite values nobody reads.
          for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
            // On the diagonal, keys past this vector's last query are all masked: P^T there is 0
            // (stored, since o += P v reads up to the end of each row tile).
            const int64_t live = diagonal ? min_i64(cols, v0 + kVecLanes) : cols;
            // Two max chains: one chain's latency, not its throughput, bounded this loop.
            vecf mx = loadv(st.data() + v0), mx1 = mx;
            int64_t j = 1;
            // Scalar math: mx = max over the live keys j of S^T[j] (per query lane)
            for (; j + 1 < live; j += 2) {
              mx = maxv(mx, loadv(st.data() + j * kBlock + v0));
              mx1 = maxv(mx1, loadv(st.data() + (j + 1) * kBlock + v0));
            }
            if (j < live) mx = maxv(mx, loadv(st.data() + j * kBlock + v0));
            mx = maxv(mx, mx1);
            const vecf m_old = loadv(m_x + v0), m_new = maxv(m_old, mx);
            const vecf a = exp_v(m_old - m_new);
            vecf sum = vecf{};
            // Scalar math: P^T[j] = exp(S^T[j] - m_new); sum += P^T[j] (0 past the live keys)
            for (j = 0; j < live; ++j) {
              const vecf pj = exp_v(loadv(st.data() + j * kBlock + v0) - m_new);
              storev(st.data() + j * kBlock + v0, pj);
              sum += pj;
            }
            for (; j < cols; ++j) storev(st.data() + j * kBlock + v0, vecf{});
            storev(l_x + v0, loadv(l_x + v0) * a + sum);
            storev(m_x + v0, m_new);
            storev(alpha.data() + v0, a);
          }
          for (int64_t i = 0; i < rows; ++i) {
            const float a = alpha.data()[i];
            if (a == 1.0f) continue;
            float* orow = oacc_x + i * p.dv_pad;
            // Scalar math: o *= alpha
            for (int64_t c = 0; c < p.dv_pad; c += kVecLanes) storev(orow + c, loadv(orow + c) * a);
          }
          // o += P v with A(i, j) = P^T[j][i]
          if (diagonal) {
            gemm_diagonal<Diagonal::keys_upto_row, true>(oacc_x, p.dv_pad, st.data(), 1, kBlock, vp_blk, p.dv_pad,
                                                         rows, p.dv_pad, cols);
          } else {
            gemm<Tiles, TileStore::accumulate>(oacc_x, p.dv_pad, st.data(), 1, kBlock, vp_blk, p.dv_pad, rows,
                                               p.dv_pad, cols);
          }
        }
      }

      for (int64_t qb = qb0; qb < qb_end; ++qb) {
        const int64_t x = qb - qb0, row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        for (int64_t i = 0; i < rows; ++i) {
          const float sum = l.data()[x * kBlock + i], inv = 1.0f / sum;
          const float* orow = oacc.data() + (x * kBlock + i) * p.dv_pad;
          T* out = o + ((b * d.S + row0 + i) * d.H + h) * d.Dv;
          if (i + kPrefetchRows < rows) prefetch_row<true>(out + kPrefetchRows * d.H * d.Dv, d.Dv);
          // Scalar math: out = o / sum
#pragma omp simd
          for (int64_t c = 0; c < d.Dv; ++c) out[c] = from_f32<T>(orow[c] * inv);
          lse[bh * d.S + row0 + i] = m.data()[x * kBlock + i] + std::log(sum);
        }
      }
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------
// One work item per (b, query head): groups of kGroupBlocks key blocks outer, query blocks (from
// the group's first) inner, so dk and dv of the group are finished in L2 before moving on, each
// query-side block is fetched once per group, and dq of the whole head accumulates in a per-item
// f32 buffer. No two items write the same memory: dk and dv go to per-head f32 partials, summed
// over each GQA group in head order afterwards (without GQA, straight into the head's columns). Every sum therefore runs in a fixed order and the
// result does not depend on scheduling. Tiles are transposed as in
// the forward: S^T = k q^T, dP^T = v dO^T, with the per-query lse and D_i across vector lanes.
// With a shared key tail (MLA), each item's share of the tail's gradient goes to a per-head f32
// partial, summed over heads in head order at the end, like the GQA partials. accumulate = false
// (MHA only) stores the gradients instead of adding to them: fresh gradient buffers then need no
// zero-fill, and are not read back.
template <class T>
void backward_blocked(T* dq, T* dk, T* dk_shared, T* dv, const float* lse, const T* dout, const T* q,
                      const KvRows<T>& kv, const T* o, const AttentionParams& d, bool accumulate = true) {
  const Plan p = make_plan(d);
  // Without GQA (MLA's case) each item owns its head's columns of dk and dv and adds into them
  // directly: the partials would only be a 2 x [B, H, S, D] f32 round trip through memory.
  const bool mha = p.group == 1;
  Scratch<float> dk_part(mha ? 0 : d.B * d.H * d.S * d.Dqk);  // [B, H, S, Dqk] this head's share of dk
  Scratch<float> dv_part(mha ? 0 : d.B * d.H * d.S * d.Dv);   // [B, H, S, Dv]
  const int64_t tail = d.Dqk - kv.k_width;                      // the shared key dims (0 without)
  Scratch<float> tail_part(d.B * d.H * d.S * tail);             // [B, H, S, tail]

  const float scale = float(d.scale);
  const int64_t heads = d.B * d.H;
  // Threads beyond one per head would only allocate and zero their per-head buffers.
  const int threads = heads < omp_get_max_threads() ? int(heads) : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    // The item's keys and values as f32 rows, packed per thread (kept while the kv head stays the
    // same): a shared copy of all heads' would be written to memory and read back from it, this
    // one stays in L2 while the item runs over it. Rows past S are never read.
    Scratch<float> kp(p.s_pad * p.dqk_pad), vp(p.s_pad * p.dv_pad);  // [s_pad, dqk_pad], [s_pad, dv_pad]
    int64_t packed_bg = -1;
    Scratch<float> qt(p.nblk * d.Dqk * kBlock, ScratchInit::zeroed);   // [nblk, Dqk, kBlock] scale * q^T per block
    Scratch<float> qs(p.s_pad * p.dqk_pad, ScratchInit::zeroed);       // [s_pad, dqk_pad] scale * q rows
    Scratch<float> dot(p.nblk * d.Dv * kBlock, ScratchInit::zeroed);   // [nblk, Dv, kBlock] dO^T per block
    Scratch<float> dos(p.s_pad * p.dv_pad, ScratchInit::zeroed);       // [s_pad, dv_pad] dO rows
    Scratch<float> dq_acc(p.s_pad * p.dqk_pad, ScratchInit::zeroed);   // [s_pad, dqk_pad] dq / scale
    Scratch<float> lse_p(p.s_pad, ScratchInit::zeroed), delta(p.s_pad, ScratchInit::zeroed);  // [s_pad] lse and D_i = rowsum(dO * O), zero past S
    Scratch<float> pt(kBlock * kBlock, ScratchInit::zeroed);           // [kBlock keys, kBlock queries] P^T
    Scratch<float> dst(kBlock * kBlock, ScratchInit::zeroed);          // [kBlock, kBlock] dP^T, then dS^T
    Scratch<float> dk_acc(kGroupBlocks * kBlock * p.dqk_pad, ScratchInit::zeroed);  // [kGroupBlocks * kBlock, dqk_pad]
    Scratch<float> dv_acc(kGroupBlocks * kBlock * p.dv_pad, ScratchInit::zeroed);   // [kGroupBlocks * kBlock, dv_pad]
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H, bg = b * d.Hkv + h / p.group;
      const T* q_h = q + (b * d.S * d.H + h) * d.Dqk;      // row i at q_h + i * H * Dqk
      const T* do_h = dout + (b * d.S * d.H + h) * d.Dv;   // row i at do_h + i * H * Dv
      if (bg != packed_bg) {
        const int64_t g = bg % d.Hkv;
        pack_key_rows(kp.data(), p.dqk_pad, kv, d, b, g, 0, d.S);
        pack_rows(vp.data(), p.dv_pad, kv.value(d, b, 0, g), kv.v_tok, d.S, d.Dv, 1.0f);
        packed_bg = bg;
      }
      pack_rows(qs.data(), p.dqk_pad, q_h, d.H * d.Dqk, d.S, d.Dqk, scale);
      pack_rows(dos.data(), p.dv_pad, do_h, d.H * d.Dv, d.S, d.Dv, 1.0f);
      for (int64_t qb = 0; qb < p.nblk; ++qb) {
        const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        // From the packed rows (in L2, already scaled) rather than from q and dO a second time.
        pack_transposed(qt.data() + qb * d.Dqk * kBlock, qs.data() + row0 * p.dqk_pad, p.dqk_pad, rows, d.Dqk, 1.0f);
        pack_transposed(dot.data() + qb * d.Dv * kBlock, dos.data() + row0 * p.dv_pad, p.dv_pad, rows, d.Dv, 1.0f);
      }
      for (int64_t i = 0; i < d.S; ++i) {
        const T* orow = o + ((b * d.S + i) * d.H + h) * d.Dv;
        if (i + kPrefetchRows < d.S) prefetch_row(orow + kPrefetchRows * d.H * d.Dv, d.Dv);
        const float* dorow = dos.data() + i * p.dv_pad;
        float sum = 0;
        // Scalar math: D_i = sum over c of dO[i, c] o[i, c]
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < d.Dv; ++c) sum += dorow[c] * to_f32(orow[c]);
        delta.data()[i] = sum;
        lse_p.data()[i] = lse[bh * d.S + i];
      }
      std::memset(dq_acc.data(), 0, size_t(p.s_pad * p.dqk_pad) * sizeof(float));

      for (int64_t kb0 = 0; kb0 < p.nblk; kb0 += kGroupBlocks) {
        const int64_t kb_end = min_i64(p.nblk, kb0 + kGroupBlocks);
        std::memset(dk_acc.data(), 0, size_t(kGroupBlocks * kBlock * p.dqk_pad) * sizeof(float));
        std::memset(dv_acc.data(), 0, size_t(kGroupBlocks * kBlock * p.dv_pad) * sizeof(float));
        for (int64_t qb = kb0; qb < p.nblk; ++qb) {
          const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
          const float* qt_blk = qt.data() + qb * d.Dqk * kBlock;  // [Dqk, kBlock]
          const float* dot_blk = dot.data() + qb * d.Dv * kBlock;  // [Dv, kBlock]
          const float* qs_blk = qs.data() + row0 * p.dqk_pad;      // [kBlock, dqk_pad]
          const float* dos_blk = dos.data() + row0 * p.dv_pad;     // [kBlock, dv_pad]
          float* dq_blk = dq_acc.data() + row0 * p.dqk_pad;        // [kBlock, dqk_pad]
          for (int64_t kb = kb0; kb < kb_end && kb <= qb; ++kb) {
            const bool diagonal = qb == kb;
            const int64_t col0 = kb * kBlock, cols = min_i64(kBlock, d.S - col0);
            const float* kp_blk = kp.data() + col0 * p.dqk_pad;  // [kBlock, dqk_pad]
            const float* vp_blk = vp.data() + col0 * p.dv_pad;   // [kBlock, dv_pad]
            float* dk_blk = dk_acc.data() + (kb - kb0) * kBlock * p.dqk_pad;     // [kBlock, dqk_pad]
            float* dv_blk = dv_acc.data() + (kb - kb0) * kBlock * p.dv_pad;      // [kBlock, dv_pad]
            // P^T = exp(S^T - lse) with S^T = k (scale q)^T; -inf above the diagonal gives 0.
            // On the diagonal the products skip what the mask zeroes (gemm_diagonal), and keys
            // past a query vector's last query get P^T = dS^T = 0 stored without computing them.
            if (diagonal) {
              gemm_diagonal<Diagonal::queries_across, false>(pt.data(), kBlock, kp_blk, p.dqk_pad, 1, qt_blk, kBlock,
                                                             cols, kBlock, d.Dqk);
              mask_diagonal(pt.data(), cols);
            } else {
              gemm<Tiles, TileStore::write>(pt.data(), kBlock, kp_blk, p.dqk_pad, 1, qt_blk, kBlock, cols, kBlock,
                                            d.Dqk);
            }
            for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
              const int64_t live = diagonal ? min_i64(cols, v0 + kVecLanes) : cols;
              const vecf lse_v = loadv(lse_p.data() + row0 + v0);
              int64_t j = 0;
              // Scalar math: P^T[j] = exp(S^T[j] - lse) (0 past the live keys)
              for (; j < live; ++j) {
                float* x = pt.data() + j * kBlock + v0;
                storev(x, exp_v(loadv(x) - lse_v));
              }
              for (; j < cols; ++j) storev(pt.data() + j * kBlock + v0, vecf{});
            }
            // dv += P^T dO
            if (diagonal) {
              gemm_diagonal<Diagonal::queries_from_row, true>(dv_blk, p.dv_pad, pt.data(), kBlock, 1, dos_blk,
                                                              p.dv_pad, cols, p.dv_pad, rows);
            } else {
              gemm<Tiles, TileStore::accumulate>(dv_blk, p.dv_pad, pt.data(), kBlock, 1, dos_blk, p.dv_pad, cols,
                                                 p.dv_pad, rows);
            }
            // dP^T = v dO^T, then dS^T = P^T (dP^T - D)
            if (diagonal) {
              gemm_diagonal<Diagonal::queries_across, false>(dst.data(), kBlock, vp_blk, p.dv_pad, 1, dot_blk, kBlock,
                                                             cols, kBlock, d.Dv);
            } else {
              gemm<Tiles, TileStore::write>(dst.data(), kBlock, vp_blk, p.dv_pad, 1, dot_blk, kBlock, cols, kBlock,
                                            d.Dv);
            }
            for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
              const int64_t live = diagonal ? min_i64(cols, v0 + kVecLanes) : cols;
              const vecf delta_v = loadv(delta.data() + row0 + v0);
              int64_t j = 0;
              // Scalar math: dS^T[j] = P^T[j] (dP^T[j] - D) (0 past the live keys)
              for (; j < live; ++j) {
                float* x = dst.data() + j * kBlock + v0;
                storev(x, loadv(pt.data() + j * kBlock + v0) * (loadv(x) - delta_v));
              }
              for (; j < cols; ++j) storev(dst.data() + j * kBlock + v0, vecf{});
            }
            // dk += scale dS^T q (qs carries the scale); dq += dS k (scaled once at the end)
            if (diagonal) {
              gemm_diagonal<Diagonal::queries_from_row, true>(dk_blk, p.dqk_pad, dst.data(), kBlock, 1, qs_blk,
                                                              p.dqk_pad, cols, p.dqk_pad, rows);
              gemm_diagonal<Diagonal::keys_upto_row, true>(dq_blk, p.dqk_pad, dst.data(), 1, kBlock, kp_blk,
                                                           p.dqk_pad, rows, p.dqk_pad, cols);
            } else {
              gemm<Tiles, TileStore::accumulate>(dk_blk, p.dqk_pad, dst.data(), kBlock, 1, qs_blk, p.dqk_pad, cols,
                                                 p.dqk_pad, rows);
              gemm<Tiles, TileStore::accumulate>(dq_blk, p.dqk_pad, dst.data(), 1, kBlock, kp_blk, p.dqk_pad, rows,
                                                 p.dqk_pad, cols);
            }
          }
        }
        for (int64_t j = kb0 * kBlock; j < min_i64(d.S, kb_end * kBlock); ++j) {
          const float* dk_row = dk_acc.data() + (j - kb0 * kBlock) * p.dqk_pad;
          const float* dv_row = dv_acc.data() + (j - kb0 * kBlock) * p.dv_pad;
          if (mha) {
            T* dk_out = dk + (b * d.S + j) * kv.k_tok + h * kv.k_head;
            T* dv_out = dv + (b * d.S + j) * kv.v_tok + h * kv.v_head;
            if (j + kPrefetchRows < d.S) {
              prefetch_row<true>(dk_out + kPrefetchRows * kv.k_tok, kv.k_width);
              prefetch_row<true>(dv_out + kPrefetchRows * kv.v_tok, d.Dv);
            }
            // Scalar math: dk = (accumulate ? dk : 0) + dk_acc
#pragma omp simd
            for (int64_t c = 0; c < kv.k_width; ++c) {
              dk_out[c] = from_f32<T>(accumulate ? to_f32(dk_out[c]) + dk_row[c] : dk_row[c]);
            }
            // Scalar math: dv = (accumulate ? dv : 0) + dv_acc
#pragma omp simd
            for (int64_t c = 0; c < d.Dv; ++c) dv_out[c] = from_f32<T>(accumulate ? to_f32(dv_out[c]) + dv_row[c] : dv_row[c]);
            if (tail > 0) {
              std::memcpy(tail_part.data() + (bh * d.S + j) * tail, dk_row + kv.k_width, size_t(tail) * sizeof(float));
            }
          } else {
            std::memcpy(dk_part.data() + (bh * d.S + j) * d.Dqk, dk_row, size_t(d.Dqk) * sizeof(float));
            std::memcpy(dv_part.data() + (bh * d.S + j) * d.Dv, dv_row, size_t(d.Dv) * sizeof(float));
          }
        }
      }
      for (int64_t i = 0; i < d.S; ++i) {
        T* out = dq + ((b * d.S + i) * d.H + h) * d.Dqk;
        if (i + kPrefetchRows < d.S) prefetch_row<true>(out + kPrefetchRows * d.H * d.Dqk, d.Dqk);
        const float* acc = dq_acc.data() + i * p.dqk_pad;
        // Scalar math: dq = (accumulate ? dq : 0) + scale * dq_acc
#pragma omp simd
        for (int64_t c = 0; c < d.Dqk; ++c) out[c] = from_f32<T>(accumulate ? to_f32(out[c]) + scale * acc[c] : scale * acc[c]);
      }
    }

    if (!mha) add_kv_partials(dk, dv, dk_part.data(), dv_part.data(), d, p);
    if (tail > 0) {
      // dk_shared[b, s] += sum over heads h of tail_part[b, h, s], in head order.
      Scratch<float> row_sum(tail, ScratchInit::zeroed);
#pragma omp for schedule(static)
      for (int64_t bs = 0; bs < d.B * d.S; ++bs) {
        const int64_t b = bs / d.S, i = bs % d.S;
        add_group_sum(dk_shared + bs * tail, row_sum.data(), tail_part.data() + (b * d.H * d.S + i) * tail,
                      d.S * tail, d.H, tail, accumulate);
      }
    }
  }
}
}  // namespace

template <class T>
void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v, const AttentionParams& d) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (pairs_fit(d))
      return cpu_amx_bf16_usable() ? forward_bf16_pairs<true>(o, lse, q, k, v, d)
                                   : forward_bf16_pairs<false>(o, lse, q, k, v, d);
  }
#endif
  forward_blocked(o, lse, q, plain_kv(k, v, d), d);
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const float* lse, const T* dout, const T* q, const T* k, const T* v,
                        const T* o, const AttentionParams& d) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (pairs_fit(d))
      return cpu_amx_bf16_usable() ? backward_bf16_pairs<true>(dq, dk, dv, lse, dout, q, k, v, o, d)
                                   : backward_bf16_pairs<false>(dq, dk, dv, lse, dout, q, k, v, o, d);
  }
#endif
  backward_blocked(dq, dk, static_cast<T*>(nullptr), dv, lse, dout, q, plain_kv(k, v, d), o, d);
}

template <class T>
void mla_attention_forward(T* o, float* lse, const T* q, const T* kv, const T* k_rope, int64_t nope_dim,
                           const AttentionParams& d) {
  forward_blocked(o, lse, q, mla_kv(kv, k_rope, nope_dim, d), d);
}

template <class T>
void mla_attention_backward(T* dq, T* dkv, T* dk_rope, const float* lse, const T* dout, const T* q, const T* kv,
                            const T* k_rope, const T* o, int64_t nope_dim, const AttentionParams& d, bool accumulate) {
  backward_blocked(dq, dkv, dk_rope, dkv + nope_dim, lse, dout, q, mla_kv(kv, k_rope, nope_dim, d), o, d,
                   accumulate);
}

template void mla_attention_forward<float>(float*, float*, const float*, const float*, const float*, int64_t,
                                           const AttentionParams&);
template void mla_attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                            const float*, const float*, const float*, int64_t, const AttentionParams&,
                                            bool);
template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionParams&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const AttentionParams&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionParams&);
template void attention_backward<bf16>(bf16*, bf16*, bf16*, const float*, const bf16*, const bf16*, const bf16*,
                                       const bf16*, const bf16*, const AttentionParams&);

}  // namespace titan::kernels::cpu::TITAN_ISA
