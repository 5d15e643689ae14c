// Fused sparse MLA forward and backward (see cpu/sparse_mla.h). Queries are independent and dkv
// goes to per-thread accumulators, so nothing needs atomics.
#include "titan/kernels/cpu/sparse_mla.h"

#include <omp.h>

#include <type_traits>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "titan/kernels/cpu/amx.h"
#endif

#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/mqa_rows.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/cpu/tile_gemm.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr float kInf = __builtin_inff();

using Tiles = MqaTiles;
constexpr int kRows = Tiles::kRows;

// Padded sizes of the per-query buffers, shared by the forward and the backward.
struct Plan {
  int64_t Dp;   // Dqk rounded up to 16: gathered rows and dkv accumulator rows
  int64_t Dvp;  // Dv rounded up to 16
  int64_t Hs;   // H rounded up to 16: the head columns of the [slot, head] score buffers
  int64_t Hr;   // H rounded up to kRows: the rows of the per-head output tiles
  int64_t Kp;   // K rounded up to kRows: the rows of the per-slot tiles
};

Plan make_plan(const SparseMlaParams& d) {
  return {round_up(d.Dqk, kPadLanes), round_up(d.Dv, kPadLanes), round_up(d.H, kPadLanes), round_up(d.H, kRows),
          round_up(d.K, kRows)};
}

// How many slots ahead the gathers prefetch the selected kv rows.
constexpr int64_t kAhead = 4;

// Starts loading row s of kv into the cache; keys outside [0, Skv) are skipped.
template <class T>
TITAN_INLINE void prefetch_row(const T* kv, int32_t s, const SparseMlaParams& d) {
  if (s < 0 || int64_t(s) >= d.Skv) return;
  const char* row = reinterpret_cast<const char*>(kv + int64_t(s) * d.Dqk);
  for (int64_t e = 0; e < d.Dqk * int64_t(sizeof(T)); e += 64) __builtin_prefetch(row + e, 0, 3);
}

// Copies the valid selected rows of query t (in slot order, as f32) to g[0, n) and their keys to
// keys[0, n), zeroes rows [n, round_up(n, kRows)) and returns n. Columns past Dqk stay zero
// from the buffer's initialization.
template <class T>
int64_t gather_valid(float* g, int64_t ldg, int32_t* keys, const T* kv, const int32_t* sel, int64_t t,
                     const SparseMlaParams& d) {
  // The rows are random rows of kv, mostly outside L2: request a few slots ahead so several
  // rows' misses are in flight while one is copied.
  for (int64_t i = 0; i < kAhead && i < d.K; ++i) prefetch_row(kv, sel[i], d);
  int64_t n = 0;
  for (int64_t i = 0; i < d.K; ++i) {
    if (i + kAhead < d.K) prefetch_row(kv, sel[i + kAhead], d);
    const int32_t s = sel[i];
    if (s < 0 || int64_t(s) > t + (d.Skv - d.S)) continue;
    const T* src = kv + int64_t(s) * d.Dqk;
    float* dst = g + n * ldg;
    // Scalar math: g[n] = kv row s, as f32
#pragma omp simd
    for (int64_t c = 0; c < d.Dqk; ++c) dst[c] = to_f32(src[c]);
    keys[n++] = s;
  }
  for (int64_t r = n; r < round_up(n, kRows); ++r) {
    for (int64_t c = 0; c < d.Dqk; ++c) g[r * ldg + c] = 0.0f;
  }
  return n;
}

// hm[i] for each slot i of query t = (1/H) sum_{h < H} p[j * ld + h] * (mul ? mul[h] : 1), j the
// position of slot i among the valid slots (gather order); 0 for invalid slots. p holds the
// probabilities (mul nullptr) or the unnormalized exp with mul = 1 / sum per head.
void write_head_mean(float* hm, const float* p, int64_t ld, const float* mul, const int32_t* sel, int64_t t,
                     const SparseMlaParams& d) {
  const float inv_h = 1.0f / float(d.H);
  int64_t j = 0;
  for (int64_t i = 0; i < d.K; ++i) {
    const int32_t s = sel[i];
    if (s < 0 || int64_t(s) > t + (d.Skv - d.S)) {
      hm[i] = 0.0f;
      continue;
    }
    const float* row = p + j++ * ld;
    float sum = 0.0f;
    if (mul) {
      // Scalar math: sum += P[j, h] (unnormalized) / sum_h
#pragma omp simd reduction(+ : sum)
      for (int64_t h = 0; h < d.H; ++h) sum += row[h] * mul[h];
    } else {
      // Scalar math: sum += P[j, h]
#pragma omp simd reduction(+ : sum)
      for (int64_t h = 0; h < d.H; ++h) sum += row[h];
    }
    hm[i] = sum * inv_h;
  }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// Copies the valid selected rows of query t (slot order, bf16) to g[0, n) (rows Dqk apart), their
// keys to keys[0, n), and each pair of rows, interleaved, to pairs[j] (rows pairs_ld apart; the
// first `width` columns; an odd last row pairs with 0s), zeroes pair rows up to the next multiple
// of 16 and returns n. Each pair is interleaved right after its second row is copied, while both
// are in L1: the VNNI operand costs no second pass over the rows.
int64_t gather_pairs(bf16* g, uint32_t* pairs, int64_t pairs_ld, int64_t width, int32_t* keys, const bf16* kv,
                     const int32_t* sel, int64_t t, const SparseMlaParams& d) {
  for (int64_t i = 0; i < kAhead && i < d.K; ++i) prefetch_row(kv, sel[i], d);  // as in gather_valid
  int64_t n = 0;
  for (int64_t i = 0; i < d.K; ++i) {
    if (i + kAhead < d.K) prefetch_row(kv, sel[i + kAhead], d);
    const int32_t s = sel[i];
    if (s < 0 || int64_t(s) > t + (d.Skv - d.S)) continue;
    // memcpy: a loop of bf16 structs stays scalar 16-bit moves
    std::memcpy(g + n * d.Dqk, kv + int64_t(s) * d.Dqk, size_t(d.Dqk) * sizeof(bf16));
    if (keys) keys[n] = s;
    if (n % 2 == 1) pack_row_pair(pairs + n / 2 * pairs_ld, g + (n - 1) * d.Dqk, g + n * d.Dqk, width);
    ++n;
  }
  if (n % 2 == 1) pack_row_pair(pairs + n / 2 * pairs_ld, g + (n - 1) * d.Dqk, nullptr, width);
  for (int64_t j = (n + 1) / 2; j < round_up((n + 1) / 2, 16); ++j) {
    // Scalar math: pairs[j] = 0
#pragma omp simd
    for (int64_t col = 0; col < width; ++col) pairs[j * pairs_ld + col] = 0;
  }
  return n;
}

// st[i, c) for i < n16, c < cols (a multiple of 16; rows cols floats apart) = g[i] . b[:, c] over
// Dqk: g [n16, Dqk] bf16 rows times b [Dqk / 2, cols] VNNI pairs, with four accumulator chains
// where the shape allows and each row tile (the operand that streams from L2) loaded once: 16
// columns: four row blocks per B tile; 32: two row blocks by two column tiles; from 64: four
// column tiles per row tile.
void rows_times_heads(float* st, int64_t cols, const bf16* g, const uint32_t* b, int64_t n16, int64_t dqk) {
  if (cols == 32) {
    for (int64_t i0 = 0; i0 < n16; i0 += 32) {
      const char* a = reinterpret_cast<const char*>(g + i0 * dqk);
      const char* bb = reinterpret_cast<const char*>(b);
      if (i0 + 32 <= n16) {
        amx_block_2x2(st + i0 * cols, cols * 4, 16 * cols * 4, a, dqk * 2, 64, 16 * dqk * 2, bb, cols * 4,
                      16 * cols * 4, dqk / 32);
      } else {
        amx_row_block(st + i0 * cols, cols * 4, 64, a, dqk * 2, 64, bb, cols * 4, 16 * cols * 4, 64, dqk / 32, 2);
      }
    }
    return;
  }
  if (cols > 32) {
    for (int64_t i0 = 0; i0 < n16; i0 += 16) {
      for (int64_t c0 = 0; c0 < cols; c0 += 64) {
        const int tiles = int((cols - c0) / 16 < 4 ? (cols - c0) / 16 : 4);
        amx_row_block(st + i0 * cols + c0, cols * 4, 64, reinterpret_cast<const char*>(g + i0 * dqk), dqk * 2, 64,
                      reinterpret_cast<const char*>(b + c0), cols * 4, 16 * cols * 4, 64, dqk / 32, tiles);
      }
    }
    return;
  }
  for (int64_t c0 = 0; c0 < cols; c0 += 16) {
    for (int64_t i0 = 0; i0 < n16; i0 += 64) {
      const int blocks = int((n16 - i0) / 16 < 4 ? (n16 - i0) / 16 : 4);
      amx_col_block(st + i0 * cols + c0, cols * 4, 16 * cols * 4, reinterpret_cast<const char*>(g + i0 * dqk),
                    dqk * 2, 64, 16 * dqk * 2, reinterpret_cast<const char*>(b + c0), cols * 4, 16 * cols * 4,
                    dqk / 32, blocks);
    }
  }
}

// The forward of sparse_mla_forward<bf16> when Dqk is a multiple of 32: products on AMX tiles
// (kAmx) or in VDPBF16PS register tiles (CPUs without AMX; the same operand layouts).
template <bool kAmx>
void forward_bf16_pairs(bf16* o, float* lse, float* head_mean, const bf16* q, const bf16* kv, const int32_t* idx,
                        const SparseMlaParams& d) {
  const Plan p = make_plan(d);
  const float scale = float(d.scale);
  const int64_t Dq2 = d.Dqk / 2;
  const int64_t Kt = round_up(d.K, 16);           // slots padded to whole tiles
  const int64_t K2 = round_up((Kt + 1) / 2, 16);  // slot pairs padded to whole tiles
#pragma omp parallel
  {
    if constexpr (kAmx) amx_configure();
    Scratch<bf16> g(Kt * d.Dqk, ScratchInit::zeroed);       // [Kt, Dqk] valid rows, bf16
    Scratch<uint32_t> qv(Dq2 * p.Hs, ScratchInit::zeroed);  // [Dqk/2, Hs] q pairs by head
    Scratch<float> st(Kt * p.Hs, ScratchInit::zeroed);      // [Kt, Hs] scores, then P, slot by head
    Scratch<uint32_t> pt(p.Hs * K2, ScratchInit::zeroed);   // [Hs, K2] P slot pairs by head
    Scratch<uint32_t> vb(K2 * p.Dvp, ScratchInit::zeroed);  // [K2, Dvp] value row pairs
    Scratch<float> out(p.Hs * p.Dvp, ScratchInit::zeroed);  // [Hs, Dvp] o rows
    Scratch<float> m(p.Hs, ScratchInit::zeroed), l(p.Hs, ScratchInit::zeroed);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bt = 0; bt < d.B * d.S; ++bt) {
      const int64_t b = bt / d.S, t = bt % d.S;
      const int64_t n =
          gather_pairs(g.data(), vb.data(), p.Dvp, d.Dv, nullptr, kv + b * d.Skv * d.Dqk, idx + bt * d.K, t, d);
      bf16* ot = o + bt * d.H * d.Dv;
      if (n == 0) {  // no valid slot: o = 0, lse = +inf (FlashMLA's convention)
        for (int64_t e = 0; e < d.H * d.Dv; ++e) ot[e] = from_f32<bf16>(0.0f);
        for (int64_t h = 0; h < d.H; ++h) lse[bt * d.H + h] = kInf;
        if (head_mean) write_head_mean(head_mean + bt * d.K, nullptr, 0, nullptr, idx + bt * d.K, t, d);
        continue;
      }
      pack_heads_vnni(qv.data(), p.Hs, q + bt * d.H * d.Dqk, d.H, d.Dqk);
      // S^T[i, h] = rows[i] . q[h] (unscaled): [n, Dqk] x [Dqk, Hs]; rows past n hold stale or zero
      // rows, finite and never read.
      if constexpr (kAmx) {
        rows_times_heads(st.data(), p.Hs, g.data(), qv.data(), round_up(n, 16), d.Dqk);
      } else {
        const int64_t n_pad = round_up(n, kRows);
        gemm<Tiles, TileStore::write>(st.data(), p.Hs, reinterpret_cast<const uint32_t*>(g.data()), Dq2, int64_t(1),
                                      qv.data(), p.Hs, n_pad, p.Hs, Dq2);
      }
      // Softmax over the n slots of each head as in the f32 path, with the scale applied here.
      for (int64_t h = 0; h < p.Hs; ++h) m.data()[h] = -kInf, l.data()[h] = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        float* row = st.data() + i * p.Hs;
        // Scalar math: s = scale * s; m = max(m, s)
#pragma omp simd
        for (int64_t h = 0; h < p.Hs; ++h) {
          row[h] *= scale;
          m.data()[h] = row[h] > m.data()[h] ? row[h] : m.data()[h];
        }
      }
      // One exp per score (it was two: for the sum, then for P = exp(s - lse)): the unnormalized
      // exp(s - m) stays in st and the pack below multiplies it by 1 / sum.
      for (int64_t i = 0; i < n; ++i) {
        float* row = st.data() + i * p.Hs;
        // Scalar math: P = exp(s - m); l += P
#pragma omp simd
        for (int64_t h = 0; h < p.Hs; ++h) {
          row[h] = fast_exp(row[h] - m.data()[h]);
          l.data()[h] += row[h];
        }
      }
      for (int64_t h = 0; h < p.Hs; ++h) {
        if (h < d.H) lse[bt * d.H + h] = m.data()[h] + __builtin_logf(l.data()[h]);
        l.data()[h] = 1.0f / l.data()[h];
      }
      // head_mean from the f32 exp before P is rounded to bf16.
      if (head_mean) write_head_mean(head_mean + bt * d.K, st.data(), p.Hs, l.data(), idx + bt * d.K, t, d);
      // P rounded to bf16 in slot pairs, heads by pairs (an odd last slot pairs with a 0).
      for (int64_t h0 = 0; h0 < p.Hs; h0 += 16)
        pack_pairs_transposed(pt.data() + h0 * K2, K2, st.data() + h0, p.Hs, n, l.data() + h0);
      // o[h] = sum_j P pair[h, j] . value pair[j]: [Hs, n2p] x [n2p, Dvp].
      if constexpr (kAmx) {
        amx_heads_times_rows(out.data(), pt.data(), K2, vb.data(), p.Hs, p.Dvp, round_up((n + 1) / 2, 16));
      } else {
        gemm<Tiles, TileStore::write>(out.data(), p.Dvp, pt.data(), K2, int64_t(1), vb.data(), p.Dvp, p.Hs, p.Dvp,
                                      (n + 1) / 2);
      }
      for (int64_t h = 0; h < d.H; ++h) store_bf16(ot + h * d.Dv, out.data() + h * p.Dvp, d.Dv);
    }
    if constexpr (kAmx) _tile_release();
  }
}

// The backward of sparse_mla_backward<bf16> when Dqk, Dv are multiples of 32. All five products
// run on bf16 pairs, on AMX tiles (kAmx) or in VDPBF16PS register tiles (without AMX, where the
// dkv product adds straight into the selected rows as in the f32 path; the notes on the tile
// path below are about AMX): [scores | dA] = rows x (q | dO), dq = (scale dS)^T x rows, and the
// dkv rows of the selected keys += (scale dS | P) (q ; dO) (key and value roles in one product,
// contraction over the 2 Hs head columns), with P and dS rounded to bf16 as operands (as FlashMLA
// does); accumulation and the softmax stay f32. What remains for the vector units is the
// scatter-add of each 16-slot block of dkv contributions into this thread's accumulator rows
// (random rows of a buffer far larger than L2: the backward's limit at H = 16, see
// cpu/sparse_mla.h). Software prefetch of the next block's rows measured no faster than none.
template <bool kAmx>
void backward_bf16_pairs(bf16* dq, bf16* dkv, const bf16* dout, const bf16* q, const bf16* kv, const int32_t* idx,
                         const bf16* o, const float* lse, float* acc, int64_t parts, const SparseMlaParams& d) {
  const Plan p = make_plan(d);
  const int64_t w2 = 2 * p.Hs;  // [scale dS | P] and [scores | dA] columns: heads, then heads again
  const float scale = float(d.scale);
  const int64_t Dq2 = d.Dqk / 2;
  const int64_t Kt = round_up(d.K, 16);
  const int64_t K2 = round_up((Kt + 1) / 2, 16);
#pragma omp parallel num_threads(int(parts))
  {
    if constexpr (kAmx) amx_configure();
    float* mine = acc + int64_t(omp_get_thread_num()) * d.Skv * p.Dp;  // this thread's dkv, f32
    Scratch<bf16> g(Kt * d.Dqk, ScratchInit::zeroed);         // [Kt, Dqk] valid rows, bf16
    Scratch<uint32_t> vq(K2 * p.Dp, ScratchInit::zeroed);     // [K2, Dp] valid row pairs
    Scratch<uint32_t> qd(Dq2 * w2, ScratchInit::zeroed);      // [Dqk/2, 2 Hs] (q | dO) pairs by head
    Scratch<uint32_t> b2(p.Hs * p.Dp, ScratchInit::zeroed);   // [Hs, Dp] (q ; dO) head pairs (0 past Dv)
    Scratch<float> st(Kt * w2, ScratchInit::zeroed);          // [Kt, 2 Hs] [scores | dA], then (scale dS | P)
    Scratch<bf16> ab(Kt * w2, ScratchInit::zeroed);           // [Kt, 2 Hs] (scale dS | P) in bf16
    Scratch<uint32_t> dst(p.Hs * K2, ScratchInit::zeroed);    // [Hs, K2] scale dS slot pairs by head
    Scratch<float> dqb(p.Hs * p.Dp, ScratchInit::zeroed);     // [Hs, Dp] dq rows
    Scratch<float> blk(16 * 64, ScratchInit::zeroed);         // [16, 64] dkv of one slot block, 64 columns
    Scratch<float> lse_h(p.Hs, ScratchInit::zeroed), delta(p.Hs, ScratchInit::zeroed);  // [Hs]
    Scratch<int32_t> keys(d.K, ScratchInit::zeroed);
    Scratch<float> dummy(p.Dp, ScratchInit::zeroed);  // C row of padding rows, never read
    Scratch<float*> c(Kt, ScratchInit::zeroed);  // C rows of the VDPBF16PS dkv product: the selected keys' rows
    for (int64_t h = d.H; h < p.Hs; ++h) lse_h.data()[h] = kInf;  // padding heads: P = 0
    for (int64_t b = 0; b < d.B; ++b) {
      // Queries dealt round-robin, not dynamically: each thread's dkv partial then sums the
      // same queries in the same order on every call (a dynamic schedule made dkv vary run to run).
#pragma omp for schedule(static, 1)
      for (int64_t t = 0; t < d.S; ++t) {
        const int64_t bt = b * d.S + t;
        const int64_t n = gather_pairs(g.data(), vq.data(), p.Dp, d.Dqk, keys.data(), kv + b * d.Skv * d.Dqk,
                                       idx + bt * d.K, t, d);
        bf16* dqt = dq + bt * d.H * d.Dqk;
        if (n == 0) {  // an empty row sends no gradient
          for (int64_t e = 0; e < d.H * d.Dqk; ++e) dqt[e] = from_f32<bf16>(0.0f);
          continue;
        }
        const bf16* qh = q + bt * d.H * d.Dqk;
        const bf16* doh = dout + bt * d.H * d.Dv;
        const bf16* oh = o + bt * d.H * d.Dv;
        for (int64_t h = 0; h < d.H; ++h) {
          delta.data()[h] = dot_bf16(doh + h * d.Dv, oh + h * d.Dv, d.Dv);  // Delta = rowsum(dO * O)
          lse_h.data()[h] = lse[bt * d.H + h];
        }
        pack_heads_vnni(qd.data(), w2, qh, d.H, d.Dqk);  // rows past Dv/2 of the dO half stay 0
        pack_heads_vnni(qd.data() + p.Hs, w2, doh, d.H, d.Dv);
        for (int64_t h = 0; h < d.H; h += 2) {  // head pairs of q, then of dO; padding pairs stay 0
          const bool odd = h + 1 == d.H;
          pack_row_pair(b2.data() + h / 2 * p.Dp, qh + h * d.Dqk, odd ? nullptr : qh + (h + 1) * d.Dqk, d.Dqk);
          pack_row_pair(b2.data() + (p.Hs + h) / 2 * p.Dp, doh + h * d.Dv, odd ? nullptr : doh + (h + 1) * d.Dv,
                        d.Dv);
        }
        // [S^T | dA^T][i] = rows[i] . (q | dO), unscaled: [n, Dqk] x [Dqk, 2 Hs] on tiles.
        const int64_t n16 = round_up(n, 16), n_pad = round_up(n, kRows);
        if constexpr (kAmx) {
          rows_times_heads(st.data(), w2, g.data(), qd.data(), n16, d.Dqk);
        } else {
          gemm<Tiles, TileStore::write>(st.data(), w2, reinterpret_cast<const uint32_t*>(g.data()), Dq2, int64_t(1),
                                        qd.data(), w2, n_pad, w2, Dq2);
        }
        // P recomputed from lse; the row becomes (scale dS | P), the A operand of dkv.
        for (int64_t i = 0; i < n; ++i) {
          float* row = st.data() + i * w2;
          // Scalar math: P = exp(scale s - lse); row = (scale P (dA - Delta) | P)
#pragma omp simd
          for (int64_t h = 0; h < p.Hs; ++h) {
            const float ph = fast_exp(scale * row[h] - lse_h.data()[h]);
            row[h] = scale * ph * (row[p.Hs + h] - delta.data()[h]);
            row[p.Hs + h] = ph;
          }
          // Scalar math: ab row i = bf16(row)
          for (int64_t c0 = 0; c0 < w2; c0 += 32) {
            const __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + c0 + 16), _mm512_loadu_ps(row + c0));
            _mm512_storeu_si512(ab.data() + i * w2 + c0, reinterpret_cast<__m512i>(both));
          }
        }
        // dq = (scale dS)^T rows: scale dS in bf16 slot pairs by head times the row pairs.
        for (int64_t h0 = 0; h0 < p.Hs; h0 += 16)
          pack_pairs_transposed(dst.data() + h0 * K2, K2, st.data() + h0, w2, n, nullptr);
        if constexpr (kAmx) {
          amx_heads_times_rows(dqb.data(), dst.data(), K2, vq.data(), p.Hs, p.Dp, round_up((n + 1) / 2, 16));
        } else {
          gemm<Tiles, TileStore::write>(dqb.data(), p.Dp, dst.data(), K2, int64_t(1), vq.data(), p.Dp, p.Hs, p.Dp,
                                        (n + 1) / 2);
        }
        for (int64_t h = 0; h < d.H; ++h) store_bf16(dqt + h * d.Dqk, dqb.data() + h * p.Dp, d.Dqk);
        if constexpr (!kAmx) {
          // dkv[key_i] += (scale dS | P)[i] (q ; dO) as in the f32 path, added straight into this
          // thread's rows of the selected keys: [n, 2 Hs] bf16 (Hs pairs) x [Hs pair rows, Dp].
          for (int64_t r = 0; r < n_pad; ++r)
            c.data()[r] = r < n ? mine + int64_t(keys.data()[r]) * p.Dp : dummy.data();
          gemm_add_rows<Tiles>(c.data(), reinterpret_cast<const uint32_t*>(ab.data()), p.Hs, int64_t(1), b2.data(),
                               p.Dp, n_pad, p.Dp, p.Hs);
          continue;
        }
        // dkv[key_i] += (scale dS | P)[i] (q ; dO): [16, 2 Hs] x [2 Hs, Dp] per slot block, 64 columns
        // at a time into blk and added to the block's accumulator rows (slots past n are computed,
        // never added): blk stays in L1 beside the B tiles of (q ; dO), where a whole [16, Dp] block
        // would not.
        for (int64_t i0 = 0; i0 < n16; i0 += 16) {
          const int64_t rows = n - i0 < 16 ? n - i0 : 16;
          for (int64_t c0 = 0; c0 < p.Dp; c0 += 64) {
            const int64_t w = p.Dp - c0 < 64 ? p.Dp - c0 : 64;
            amx_row_block(blk.data(), 64 * 4, 64, reinterpret_cast<const char*>(ab.data() + i0 * w2), w2 * 2, 64,
                          reinterpret_cast<const char*>(b2.data() + c0), p.Dp * 4, 16 * p.Dp * 4, 64, w2 / 32,
                          int(w / 16));
            for (int64_t r = 0; r < rows; ++r) {
              float* dst_row = mine + int64_t(keys.data()[i0 + r]) * p.Dp + c0;
              const float* src = blk.data() + r * 64;
              // Scalar math: dkv[key] += blk row r
#pragma omp simd
              for (int64_t col = 0; col < w; ++col) dst_row[col] += src[col];
            }
          }
        }
      }
      // (barrier) dkv = the sum of the per-thread accumulators, which are zeroed for the next b.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < d.Skv; ++s) {
        float* first = acc + s * p.Dp;
        for (int64_t part = 1; part < parts; ++part) {
          float* row = acc + (part * d.Skv + s) * p.Dp;
          // Scalar math: first += the partial; partial = 0
#pragma omp simd
          for (int64_t col = 0; col < p.Dp; ++col) first[col] += row[col], row[col] = 0.0f;
        }
        store_bf16(dkv + (b * d.Skv + s) * d.Dqk, first, d.Dqk);
        // Scalar math: first = 0
#pragma omp simd
        for (int64_t col = 0; col < p.Dp; ++col) first[col] = 0.0f;
      }
    }
    if constexpr (kAmx) _tile_release();
  }
}
#endif

}  // namespace

int64_t sparse_mla_acc_width(int64_t dqk) { return (dqk + kPadLanes - 1) / kPadLanes * kPadLanes; }

template <class T>
void sparse_mla_forward(T* o, float* lse, float* head_mean, const T* q, const T* kv, const int32_t* idx,
                        const SparseMlaParams& d) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (d.Dqk % 32 == 0) {
      return cpu_amx_bf16_usable() ? forward_bf16_pairs<true>(o, lse, head_mean, q, kv, idx, d)
                                   : forward_bf16_pairs<false>(o, lse, head_mean, q, kv, idx, d);
    }
  }
#endif
  const Plan p = make_plan(d);
  const float scale = float(d.scale);
#pragma omp parallel
  {
    // Per-thread buffers of one query, zero-initialized so every padding lane is a finite 0.
    Scratch<float> g(p.Kp * p.Dp, ScratchInit::zeroed);    // [Kp, Dp] its valid rows, f32
    Scratch<float> qt(d.Dqk * p.Hs, ScratchInit::zeroed);  // [Dqk, Hs] scale * q^T
    // [Kp + 1, Hs] scores, then P, slot by head; the extra row covers the head-padding rows of
    // the output tile, which read up to Hr - Hs < 16 floats past the last slot.
    Scratch<float> st((p.Kp + 1) * p.Hs, ScratchInit::zeroed);
    Scratch<float> out(p.Hr * p.Dvp, ScratchInit::zeroed);  // [Hr, Dvp] o rows (P is already normalized)
    Scratch<float> m(p.Hs, ScratchInit::zeroed), l(p.Hs, ScratchInit::zeroed);  // [Hs] per-head max, sum
    Scratch<int32_t> keys(d.K, ScratchInit::zeroed);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bt = 0; bt < d.B * d.S; ++bt) {
      const int64_t b = bt / d.S, t = bt % d.S;
      const int64_t n = gather_valid(g.data(), p.Dp, keys.data(), kv + b * d.Skv * d.Dqk, idx + bt * d.K, t, d);
      T* ot = o + bt * d.H * d.Dv;
      if (n == 0) {  // no valid slot: o = 0, lse = +inf (FlashMLA's convention)
        for (int64_t e = 0; e < d.H * d.Dv; ++e) ot[e] = from_f32<T>(0.0f);
        for (int64_t h = 0; h < d.H; ++h) lse[bt * d.H + h] = kInf;
        if (head_mean) write_head_mean(head_mean + bt * d.K, nullptr, 0, nullptr, idx + bt * d.K, t, d);
        continue;
      }
      const T* qh = q + bt * d.H * d.Dqk;
      transpose_heads(qt.data(), p.Hs, qh, d.Dqk, d.H, d.Dqk, scale);
      // S^T[i, h] = scale * rows[i] . q[h]: [n, Dqk] x [Dqk, Hs]; every head reuses each row.
      const int64_t n_pad = round_up(n, kRows);
      gemm<Tiles, TileStore::write>(st.data(), p.Hs, g.data(), p.Dp, 1, qt.data(), p.Hs, n_pad, p.Hs, d.Dqk);
      // Softmax over the n slots of each head, vectorized across heads (padding heads see 0s).
      softmax_over_keys(st.data(), n, p.Hs, m.data(), l.data());
      for (int64_t h = 0; h < d.H; ++h) lse[bt * d.H + h] = m.data()[h];
      if (head_mean) write_head_mean(head_mean + bt * d.K, st.data(), p.Hs, nullptr, idx + bt * d.K, t, d);
      // o[h] = sum_i P[i, h] rows[i][:Dv]: [Hr, n] (P read transposed) x [n, Dvp]
      gemm<Tiles, TileStore::write>(out.data(), p.Dvp, st.data(), 1, p.Hs, g.data(), p.Dp, p.Hr, p.Dvp, n);
      for (int64_t h = 0; h < d.H; ++h) {
        // Scalar math: o[h] = out[h]
#pragma omp simd
        for (int64_t col = 0; col < d.Dv; ++col) ot[h * d.Dv + col] = from_f32<T>(out.data()[h * p.Dvp + col]);
      }
    }
  }
}

template <class T>
void sparse_mla_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,
                         const float* lse, float* acc, int64_t parts, const SparseMlaParams& d) {
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (d.Dqk % 32 == 0 && d.Dv % 32 == 0) {
      return cpu_amx_bf16_usable() ? backward_bf16_pairs<true>(dq, dkv, dout, q, kv, idx, o, lse, acc, parts, d)
                                   : backward_bf16_pairs<false>(dq, dkv, dout, q, kv, idx, o, lse, acc, parts, d);
    }
  }
#endif
  const Plan p = make_plan(d);
  const int64_t w2 = 2 * p.Hs;  // [scale dS | P] and [scores | dA] columns: heads, then heads again
  const float scale = float(d.scale);
#pragma omp parallel num_threads(int(parts))
  {
    float* mine = acc + int64_t(omp_get_thread_num()) * d.Skv * p.Dp;  // this thread's dkv, f32
    Scratch<float> g(p.Kp * p.Dp, ScratchInit::zeroed);       // [Kp, Dp] valid rows
    Scratch<float> qdt(p.Dp * w2, ScratchInit::zeroed);       // [Dp, 2 Hs] (scale q^T | dO^T, 0 past Dv)
    Scratch<float> b2(w2 * p.Dp, ScratchInit::zeroed);        // [2 Hs, Dp] (q ; dO, 0 past Dv)
    Scratch<float> st((p.Kp + 1) * w2, ScratchInit::zeroed);  // [Kp + 1, 2 Hs] see the forward's st
    Scratch<float> dqb(p.Hr * p.Dp, ScratchInit::zeroed);     // [Hr, Dp] dq rows
    Scratch<float> lse_h(p.Hs, ScratchInit::zeroed), delta(p.Hs, ScratchInit::zeroed);  // [Hs]
    Scratch<float> dummy(p.Dp, ScratchInit::zeroed);          // C row of padding rows, never read
    Scratch<int32_t> keys(d.K, ScratchInit::zeroed);
    Scratch<float*> c(p.Kp, ScratchInit::zeroed);  // C rows of the dkv product: the selected keys' rows
    for (int64_t h = d.H; h < p.Hs; ++h) lse_h.data()[h] = kInf;  // padding heads: P = 0
    for (int64_t b = 0; b < d.B; ++b) {
      // Queries dealt round-robin, not dynamically: each thread's dkv partial then sums the
      // same queries in the same order on every call (a dynamic schedule made dkv vary run to run).
#pragma omp for schedule(static, 1)
      for (int64_t t = 0; t < d.S; ++t) {
        const int64_t bt = b * d.S + t;
        const int64_t n = gather_valid(g.data(), p.Dp, keys.data(), kv + b * d.Skv * d.Dqk, idx + bt * d.K, t, d);
        T* dqt = dq + bt * d.H * d.Dqk;
        if (n == 0) {  // an empty row sends no gradient
          for (int64_t e = 0; e < d.H * d.Dqk; ++e) dqt[e] = from_f32<T>(0.0f);
          continue;
        }
        const T* qh = q + bt * d.H * d.Dqk;
        const T* doh = dout + bt * d.H * d.Dv;
        const T* oh = o + bt * d.H * d.Dv;
        transpose_heads(qdt.data(), w2, qh, d.Dqk, d.H, d.Dqk, scale);
        transpose_heads(qdt.data() + p.Hs, w2, doh, d.Dv, d.H, d.Dv, 1.0f);
        for (int64_t h = 0; h < d.H; ++h) {
          float* b2q = b2.data() + h * p.Dp;
          float* b2d = b2.data() + (p.Hs + h) * p.Dp;
          float dl = 0;  // Delta = rowsum(dO * O)
          // Scalar math: Delta += dO o; b2 dO row = dO
#pragma omp simd reduction(+ : dl)
          for (int64_t col = 0; col < d.Dv; ++col) {
            const float dov = to_f32(doh[h * d.Dv + col]);
            dl += dov * to_f32(oh[h * d.Dv + col]);
            b2d[col] = dov;
          }
          // Scalar math: b2 q row = q
#pragma omp simd
          for (int64_t col = 0; col < d.Dqk; ++col) b2q[col] = to_f32(qh[h * d.Dqk + col]);
          delta.data()[h] = dl;
          lse_h.data()[h] = lse[bt * d.H + h];
        }
        // [S^T | dA^T][i] = rows[i] . (scale q | dO): one [n, Dqk] x [Dqk, 2 Hs] product.
        const int64_t n_pad = round_up(n, kRows);
        gemm<Tiles, TileStore::write>(st.data(), w2, g.data(), p.Dp, 1, qdt.data(), w2, n_pad, w2, d.Dqk);
        // P recomputed from lse; the row becomes (scale dS | P), the A operand of dq and dkv.
        scores_to_grads(st.data(), n, p.Hs, lse_h.data(), delta.data(), scale);
        // dq[h] = sum_i scale dS[i, h] rows[i]: [Hr, n] (read transposed) x [n, Dp]
        gemm<Tiles, TileStore::write>(dqb.data(), p.Dp, st.data(), 1, w2, g.data(), p.Dp, p.Hr, p.Dp, n);
        for (int64_t h = 0; h < d.H; ++h) {
          // Scalar math: dq[h] = dqb[h]
#pragma omp simd
          for (int64_t col = 0; col < d.Dqk; ++col) dqt[h * d.Dqk + col] = from_f32<T>(dqb.data()[h * p.Dp + col]);
        }
        // dkv[key_i] += (scale dS | P)[i] (q ; dO): key and value roles in one [n, 2 Hs] x [2 Hs, Dp]
        // product, added straight into this thread's rows of the selected keys.
        for (int64_t r = 0; r < n_pad; ++r) c.data()[r] = r < n ? mine + int64_t(keys.data()[r]) * p.Dp : dummy.data();
        gemm_add_rows<Tiles>(c.data(), st.data(), w2, 1, b2.data(), p.Dp, n_pad, p.Dp, w2);
      }
      // (barrier) dkv = the sum of the per-thread accumulators, which are zeroed for the next b.
#pragma omp for schedule(static)
      for (int64_t s = 0; s < d.Skv; ++s) sum_partial_rows(dkv + (b * d.Skv + s) * d.Dqk, d.Dqk, acc, s, d.Skv, parts, p.Dp);
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                           \
  template void sparse_mla_forward<T>(T*, float*, float*, const T*, const T*, const int32_t*, const SparseMlaParams&); \
  template void sparse_mla_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, const T*, const float*,   \
                                       float*, int64_t, const SparseMlaParams&);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
