// DeepSeek-V4 attention's CSA entries, one query at a time (the f32 kernel's second part; see
// cpu/v4_attention.cpp). Per-ISA like isa.h: everything here lives in the per-ISA namespace.
//
// The f32 kernel runs 16 / H neighbouring queries per block so that their (query, head) pairs fill
// the 16 columns of its score tiles. Their windows nearly coincide, and an HCA layer's entries are
// shared, so one key list serves the block. A CSA layer's selected entries do not: each query
// picks its own top-k of the visible entries, and at long S the union of a block's four lists was
// about 3.3x one list (top-512 of 4096 visible entries at 32K), each key scored for all 16 columns.
// Here each query runs its own entries with its heads as rows and the keys as columns, so no key
// is scored for a query that did not select it:
// - in place (f32 entries, AVX-512, H dividing 16: the debug models' 4 heads): the products read
//   the rows where they are (cpu/v4_lane_scores.h);
// - otherwise the rows are gathered into g (f32) and its transpose gt, and register-tiled
//   products run over them (scores^T [H, n] = q [H, D] x gt [D, n]).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/cpu/tile_gemm.h"
#include "titan/kernels/cpu/v4_attention.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#include "titan/kernels/cpu/v4_lane_scores.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

// Heads as rows: 4 rows (the debug models' 4 heads, any H through row tails) by 4 vectors with
// AVX-512. Not wider: tile_madd unrolls at most 4 vectors, and a 6-vector tile left its
// accumulators in memory (a load, an FMA and a store per vector: 8x slower).
struct EntryTiles : TileDefaults {
#if defined(__AVX512F__)
  static constexpr int kRows = 4, kVecs = 4;
#else
  static constexpr int kRows = 4, kVecs = 2;
#endif
  static constexpr int kNarrowRows = kRows;
};

// Per-thread buffers of one query's entries. ld, the row length of gt and s: K rounded up to 16,
// plus 16, so that their rows are not a power of two bytes apart (at K = 512 rows 2 KiB apart fall
// in two L1 sets, and the score product, which walks gt's rows, ran 8x slower than the output's).
//
// In place (f32 rows, AVX-512, lane_groups_fit): the products read the rows where they are, through
// `rows`; otherwise they read a gathered copy (g) and its transpose (gt).
struct EntryBuffers {
  int64_t ld, Dp;
  bool in_place;
  int32_t* keys;       // [K] the valid slots' entries, slot order (a repeated slot repeats)
  const float** rows;  // [ld] in place: entry j's row (past n: the zero row or a stale one, unused)
  float* qq;           // [2 H Dp] in place: the heads packed for the lane-group scores
  float* g;            // [ld, Dp] otherwise: their rows, f32, rows past n zero
  float* gt;           // [Dp, ld] otherwise: the same, transposed
  float* s;            // [2 H, ld] scores (forward: then P), or [scale dS ; P] (backward)
  float* sum;          // [ld] the head mean's per-entry sums (forward, with head_mean)
  float* qd;           // [2 H, Dp] (q ; dO) rows of the backward's key product
};

// Owns one thread's EntryBuffers (every padding lane a finite 0) and the backward's row pointers.
// f32_rows: the entries are f32 (the in-place path may read them where they are).
class EntryScratch {
 public:
  EntryScratch(const V4AttentionParams& d, int64_t Dp, bool backward, [[maybe_unused]] bool f32_rows)
      : ld_(round_up(max_i64(d.K, 1), kPadLanes) + kPadLanes),
#if defined(TITAN_AVX512_ROWS)
        in_place_(f32_rows && lane_groups_fit(d.H, d.D)),
#else
        in_place_(false),  // the lane-group products are AVX-512's
#endif
        keys_(ld_),
        rows_in_place_(in_place_ ? ld_ : 1),
        qq_(in_place_ ? 2 * d.H * Dp : 1),
        zero_(Dp, ScratchInit::zeroed),
        g_(in_place_ ? 1 : ld_ * Dp, ScratchInit::zeroed),
        gt_(in_place_ ? 1 : Dp * ld_, ScratchInit::zeroed),
        s_(2 * d.H * ld_, ScratchInit::zeroed),
        sum_(ld_),
        qd_(backward ? 2 * d.H * Dp : 1),
        rows_(backward ? ld_ : 1) {
    buf = {ld_,       Dp,          in_place_, keys_.data(), rows_in_place_.data(), qq_.data(), g_.data(),
           gt_.data(), s_.data(), sum_.data(), qd_.data()};
    for (int64_t j = 0; in_place_ && j < ld_; ++j) buf.rows[j] = zero_.data();
  }
  EntryBuffers buf;
  float** rows() { return rows_.data(); }  // [ld] C rows of the backward's key product

 private:
  int64_t ld_;
  bool in_place_;
  Scratch<int32_t> keys_;
  Scratch<const float*> rows_in_place_;
  Scratch<float> qq_, zero_, g_, gt_, s_, sum_, qd_;
  Scratch<float*> rows_;
};

// Lists query t's valid slots' entries (slot order) in buf.keys, and points buf.rows at them (in
// place) or gathers them into g and gt. Returns n, the number listed.
template <class T>
int64_t gather_entries(EntryBuffers& buf, const int32_t* sel, int64_t t, const T* comp, const V4AttentionParams& d) {
  int64_t n = 0;
  for (int64_t i = 0; i < d.K; ++i)
    if (v4_slot_valid(d, sel[i], t)) buf.keys[n++] = sel[i];
  if constexpr (std::is_same_v<T, float>) {
    if (buf.in_place) {
      // Rows past n keep the zero row from the buffer's start, or a row an earlier query listed:
      // their scores are computed and never read.
      for (int64_t j = 0; j < n; ++j) buf.rows[j] = comp + int64_t(buf.keys[j]) * d.D;
      return n;
    }
  }
  const int64_t n16 = round_up(n, kPadLanes);
  for (int64_t j = 0; j < n16; ++j) {
    float* dst = buf.g + j * buf.Dp;
    if (j >= n) {
      std::memset(dst, 0, size_t(buf.Dp) * sizeof(float));
      continue;
    }
    const T* src = comp + int64_t(buf.keys[j]) * d.D;
    // Scalar math: g[j] = entry row, as f32 (columns past D stay zero from the buffer's start)
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) dst[c] = to_f32(src[c]);
  }
#if defined(TITAN_AVX512_ROWS)
  for (int64_t j0 = 0; j0 < n16; j0 += 16) {
    for (int64_t c0 = 0; c0 < buf.Dp; c0 += 16) {
      transpose16_u32(reinterpret_cast<uint32_t*>(buf.gt + c0 * buf.ld + j0), buf.ld,
                      reinterpret_cast<const uint32_t*>(buf.g + j0 * buf.Dp + c0), buf.Dp);
    }
  }
#else
  for (int64_t j = 0; j < n16; ++j) {
    // Scalar math: gt[c][j] = g[j][c]
    for (int64_t c = 0; c < buf.Dp; ++c) buf.gt[c * buf.ld + j] = buf.g[j * buf.Dp + c];
  }
#endif
  return n;
}

// s [H, ld] columns 0 .. round_up(n, 16) - 1 = the entries' scores against the heads at columns
// col0 .. col0 + H - 1 of qt [D, ldq] (transposed head rows); qq: packing scratch.
inline void entry_scores(float* s, const float* qt, int64_t ldq, int64_t col0, [[maybe_unused]] float* qq,
                         const EntryBuffers& buf, int64_t n, const V4AttentionParams& d) {
  const int64_t n16 = round_up(n, kPadLanes);
#if defined(TITAN_AVX512_ROWS)
  if (buf.in_place) {
    pack_lane_q(qq, qt, ldq, col0, d.H, d.D);
    lane_scores(s, buf.ld, qq, d.H, d.D, buf.rows, n16);
    return;
  }
#endif
  gemm<EntryTiles, TileStore::write>(s, buf.ld, qt + col0, 1, ldq, buf.gt, buf.ld, d.H, n16, d.D);
}

// out [H, Dp] (rows Dp apart) += p [H, n] (rows ld apart) x the entries' rows.
inline void entry_product(float* out, const float* p, const EntryBuffers& buf, int64_t n, const V4AttentionParams& d) {
#if defined(TITAN_AVX512_ROWS)
  if (buf.in_place) return rows_product(out, buf.Dp, p, buf.ld, d.H, buf.rows, n, d.D);
#endif
  gemm<EntryTiles, TileStore::accumulate>(out, buf.Dp, p, buf.ld, 1, buf.g, buf.Dp, d.H, buf.Dp, n);
}

// The forward's entries of one query whose window is already in the running softmax: for head h
// (column col0 + h of the block) m[col], l[col] and out row col (rows Dp apart, unnormalized) take
// in its n >= 1 entries (buf after gather_entries). qt [D, ldq]: scale q^T, column col0 + h
// head h. With hm, the indexer's target of the query's slots too: hm[i] = (1/H) sum over heads of
// head h's softmax over the valid slots alone, 0 for the slots that are not valid.
inline void forward_entries(float* out, float* m, float* l, const float* qt, int64_t ldq, int64_t col0,
                            EntryBuffers& buf, int64_t n, float* hm, const int32_t* sel, int64_t t,
                            const V4AttentionParams& d) {
  // scores^T [H, n] = (scale q) [H, D] (read from q^T) x rows^T [D, n]
  entry_scores(buf.s, qt, ldq, col0, buf.qq, buf, n, d);
  for (int64_t j = 0; hm && j < n; ++j) buf.sum[j] = 0.0f;
  for (int64_t h = 0; h < d.H; ++h) {
    float* row = buf.s + h * buf.ld;
    const int64_t col = col0 + h;
    // One exp per score serves both softmaxes: e = exp(s - max over the entries) gives the
    // indexer's target (a softmax over the entries alone), and e exp(entries' max - running max)
    // the attention's P.
    float top = row[0];
#pragma omp simd reduction(max : top)
    for (int64_t j = 1; j < n; ++j) top = row[j] > top ? row[j] : top;
    float total = 0.0f;
    // Scalar math: e = exp(s - top); total += e
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j < n; ++j) {
      row[j] = fast_exp(row[j] - top);
      total += row[j];
    }
    const float mx = m[col] > top ? m[col] : top;
    const float alpha = fast_exp(m[col] - mx), beta = fast_exp(top - mx), inv = 1.0f / (total * float(d.H));
    m[col] = mx, l[col] = l[col] * alpha + total * beta;
    if (hm) {
      // Scalar math: hm sums e / (total H) over heads
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) buf.sum[j] += row[j] * inv;
    }
    // Scalar math: P = e beta
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    float* o = out + col * buf.Dp;
    // Scalar math: out[col] *= alpha
#pragma omp simd
    for (int64_t c = 0; c < buf.Dp; ++c) o[c] *= alpha;
  }
  if (hm) {
    int64_t j = 0;
    for (int64_t i = 0; i < d.K; ++i) hm[i] = v4_slot_valid(d, sel[i], t) ? buf.sum[j++] : 0.0f;
  }
  // out[col0 .. col0 + H) += P [H, n] x rows [n, Dp]
  entry_product(out + col0 * buf.Dp, buf.s, buf, n, d);
}

// The backward's entries of one query (buf after gather_entries, n >= 1): dq rows col0 .. col0 + H
// of dqb (rows Dp apart) += their part, and each entry's row of this thread's key gradients
// (mine, rows Dp apart; entry w at row Skv + w) += (scale dS) q + P dO. qdt [D, ldq]: (scale q^T |
// dO^T), head h at columns col0 + h and hs + col0 + h; q_rows, do_rows [H, Dp] the query's q and dO
// rows; lse and delta per column; dummy: a row past every key's, for the padding rows; rows
// [ld] scratch.
inline void backward_entries(float* dqb, float* mine, float* dummy, float** rows, const float* qdt,
                             int64_t ldq, int64_t hs, int64_t col0, const float* q_rows, const float* do_rows,
                             const float* lse, const float* delta, float scale, EntryBuffers& buf, int64_t n,
                             const V4AttentionParams& d) {
  const int64_t H = d.H;
  float* ds = buf.s;              // rows 0 .. H - 1: scale dS
  float* p = buf.s + H * buf.ld;  // rows H .. 2 H - 1: P
  entry_scores(p, qdt, ldq, col0, buf.qq, buf, n, d);
  entry_scores(ds, qdt, ldq, hs + col0, buf.qq + H * buf.Dp, buf, n, d);
  for (int64_t h = 0; h < H; ++h) {
    float* pr = p + h * buf.ld;
    float* dr = ds + h * buf.ld;
    const float lh = lse[col0 + h], dl = delta[col0 + h];
    // Scalar math: P = exp(s - lse); dS = scale P (dA - Delta); columns past n stay finite and reach
    // only `dummy` below
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const float ph = fast_exp(pr[j] - lh);
      dr[j] = scale * ph * (dr[j] - dl);
      pr[j] = ph;
    }
  }
  // dq[col0 .. col0 + H) += (scale dS) [H, n] x rows [n, Dp]
  entry_product(dqb + col0 * buf.Dp, ds, buf, n, d);
  // entry rows += [scale dS ; P]^T [n, 2 H] x (q ; dO) [2 H, Dp], added straight into mine
  std::memcpy(buf.qd, q_rows, size_t(H * buf.Dp) * sizeof(float));
  std::memcpy(buf.qd + H * buf.Dp, do_rows, size_t(H * buf.Dp) * sizeof(float));
  const int64_t n4 = round_up(n, EntryTiles::kRows);
  for (int64_t r = 0; r < n4; ++r) rows[r] = r < n ? mine + (d.Skv + int64_t(buf.keys[r])) * buf.Dp : dummy;
  // A repeated slot lists one row twice: both adds land because gemm_add_rows reads, adds and
  // stores each C row in turn (TileStore::add), not all of a tile's rows up front.
  gemm_add_rows<EntryTiles>(rows, buf.s, 1, buf.ld, buf.qd, buf.Dp, n4, buf.Dp, 2 * H);
}

}  // namespace titan::kernels::cpu::TITAN_ISA
