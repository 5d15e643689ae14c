// Fused DeepSeek-V4 attention forward and backward (see cpu/v4_attention.h). Queries are
// independent and the key-row gradients go to per-thread accumulators, so nothing needs atomics.
#include "titan/kernels/cpu/v4_attention.h"

#include <omp.h>

#include <cstring>
#include <optional>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/mqa_rows.h"
#include "titan/kernels/cpu/scratch.h"
#include "titan/kernels/cpu/tile_gemm.h"
#include "titan/kernels/cpu/v4_csa_entries.h"
#if defined(__AVX512BF16__)
#include "titan/kernels/cpu/bf16_pairs.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr float kInf = __builtin_inff();

using Tiles = MqaTiles;
constexpr int kRows = Tiles::kRows;

// Floats of one chunk of gathered key rows (128 KiB): with the heads' operands beside it, a
// chunk stays in L2 through the products that reuse it. A query's keys (up to W + K rows, 1.3 MB
// at V4's 640 of 512 dims) run chunk by chunk.
constexpr int64_t kChunkFloats = 32768;

// Padded sizes of the per-block buffers, shared by the forward and the backward. A block is up to
// Q consecutive queries of one batch element whose Q H (query, head) pairs are the columns of its
// score tiles (column qi H + h: query t0 + qi, head h).
struct Plan {
  int64_t Q;      // queries per block: 16 / H with fewer than 16 heads (the columns fill a vector), else 1
  int64_t Dp;     // D rounded up to 16: gathered rows and accumulator rows
  int64_t Hs;     // Q H rounded up to 16: the columns of the [key, column] score buffers
  int64_t Hr;     // Q H rounded up to kRows: the rows of the per-column output tiles
  int64_t most;   // the most keys a block sees
  int64_t chunk;  // keys per chunk, a multiple of kRows: the rows of the per-key tiles
};

// The f32 kernel runs blocks of Q = 16 / H queries whose key lists hold their windows and, in an
// HCA layer, the visible entries (a CSA layer's selected entries run per query,
// cpu/v4_csa_entries.h); the bf16-pair path runs one query per block, heads padded, its selected
// entries in its key list.
enum class PlanFor { f32_blocks, bf16_queries };

Plan make_plan(const V4AttentionParams& d, PlanFor kind = PlanFor::f32_blocks) {
  Plan p;
  p.Q = kind == PlanFor::bf16_queries ? 1 : max_i64(kPadLanes / d.H, 1);
  p.Dp = round_up(d.D, kPadLanes), p.Hs = round_up(p.Q * d.H, kPadLanes), p.Hr = round_up(p.Q * d.H, kRows);
  const int64_t entries = d.K == 0 ? d.T : kind == PlanFor::bf16_queries ? min_i64(d.K, d.T) : 0;
  p.most = min_i64(d.W + p.Q - 1, d.Skv) + entries;
  p.chunk = min_i64(round_up(p.most, kRows), max_i64(kChunkFloats / p.Dp / kRows, 1) * kRows);
  return p;
}

// A key's bias for a query of its block that does not see it: the score plus this is below
// -88.7, where fast_exp gives exactly 0 (a finite value, unlike -inf, keeps max - max defined in
// a column that has seen nothing else yet; its own row, always in the first chunk, then zeroes it).
constexpr float kUnseen = -1e30f;

// The keys of the nq <= Q queries t0 .. t0 + nq - 1 (one batch element) together, as rows of
// [kv | comp] (raw key row j: j; entry w: Skv + w), to keys[0, n): the union of their windows (rows
// window_start(t0) .. self_row(t0 + nq - 1), contiguous), then in an HCA layer (csa false) every
// entry the last query sees. bias [n, Q]: what each query adds to its score of each key: 0 when
// the key is one of its own, kUnseen when not. Returns n.
int64_t block_keys(int32_t* keys, float* bias, bool csa, int64_t t0, int64_t nq, int64_t Q, const V4AttentionParams& d) {
  const int64_t last = t0 + nq - 1;
  int64_t n = 0;
  for (int64_t j = v4_window_start(d, t0); j <= v4_self_row(d, last); ++j, ++n) {
    keys[n] = int32_t(j);
    for (int64_t qi = 0; qi < Q; ++qi) {
      const bool sees = qi < nq && v4_window_start(d, t0 + qi) <= j && j <= v4_self_row(d, t0 + qi);
      bias[n * Q + qi] = sees ? 0.0f : kUnseen;
    }
  }
  if (csa) return n;
  for (int64_t w = 0; w < v4_visible_entries(d, last); ++w, ++n) {
    keys[n] = int32_t(d.Skv + w);
    for (int64_t qi = 0; qi < Q; ++qi) bias[n * Q + qi] = qi < nq && w < v4_visible_entries(d, t0 + qi) ? 0.0f : kUnseen;
  }
  return n;
}

// Scores st [cn, ld] (column qi H + h) of keys c0 .. c0 + cn - 1 += their bias for the query of
// each column, for the block's Q H columns.
void add_bias(float* st, int64_t ld, const float* bias, int64_t c0, int64_t cn, int64_t Q, int64_t H) {
  for (int64_t i = 0; i < cn; ++i) {
    float* row = st + i * ld;
    const float* b = bias + (c0 + i) * Q;
    for (int64_t qi = 0; qi < Q; ++qi) {
      const float add = b[qi];
      if (add == 0.0f) continue;
      for (int64_t h = 0; h < H; ++h) row[qi * H + h] += add;
    }
  }
}

// Copies the rows of keys[0, n) (as f32) to g[0, n), rows ldg apart, and zeroes rows
// [n, round_up(n, kRows)). Columns past D stay zero from the buffer's initialization.
template <class T>
void gather_rows(float* g, int64_t ldg, const int32_t* keys, int64_t n, const T* kv, const T* comp,
                 const V4AttentionParams& d) {
  for (int64_t i = 0; i < n; ++i) {
    const T* src = keys[i] < d.Skv ? kv + int64_t(keys[i]) * d.D : comp + (int64_t(keys[i]) - d.Skv) * d.D;
    float* dst = g + i * ldg;
    // Scalar math: g[i] = key row i, as f32
#pragma omp simd
    for (int64_t c = 0; c < d.D; ++c) dst[c] = to_f32(src[c]);
  }
  for (int64_t r = n; r < round_up(n, kRows); ++r) {
    for (int64_t c = 0; c < d.D; ++c) g[r * ldg + c] = 0.0f;
  }
}

// One chunk of the forward's online softmax, vectorized across heads: st [n, Hs] holds the
// chunk's scores; m and l (per head) the running max and sum of exp(s - m) over the chunks so
// far (the sink included); alpha receives exp(m_old - m_new), the factor the output rows
// accumulated so far must be scaled by, and st the chunk's exp(s - m_new).
void softmax_chunk(float* st, int64_t n, int64_t Hs, float* m, float* l, float* alpha) {
  for (int64_t h = 0; h < Hs; ++h) alpha[h] = m[h];  // the old max, for now
  for (int64_t i = 0; i < n; ++i) {
    const float* row = st + i * Hs;
    // Scalar math: m = max(m, s)
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) m[h] = row[h] > m[h] ? row[h] : m[h];
  }
  // Scalar math: alpha = exp(m_old - m); l *= alpha (m_old = -inf on the first chunk without a sink: 0)
#pragma omp simd
  for (int64_t h = 0; h < Hs; ++h) alpha[h] = fast_exp(alpha[h] - m[h]), l[h] *= alpha[h];
  for (int64_t i = 0; i < n; ++i) {
    float* row = st + i * Hs;
    // Scalar math: P = exp(s - m); l += P
#pragma omp simd
    for (int64_t h = 0; h < Hs; ++h) {
      row[h] = fast_exp(row[h] - m[h]);
      l[h] += row[h];
    }
  }
}

// Starts each head's online softmax from the sink: max = sink, sum = exp(sink - sink) = 1
// (padding heads, or no sink: max -inf, sum 0).
void start_softmax(float* m, float* l, const float* sink, int64_t H, int64_t Hs) {
  for (int64_t h = 0; h < Hs; ++h) {
    const bool has = sink && h < H;
    m[h] = has ? sink[h] : -kInf, l[h] = has ? 1.0f : 0.0f;
  }
}

// out[h] *= alpha[h] for h < H (rows ld apart, ld floats each): the rows accumulated over the
// earlier chunks, brought to the new running max.
void rescale_rows(float* out, int64_t ld, const float* alpha, int64_t H) {
  for (int64_t h = 0; h < H; ++h) {
    float* row = out + h * ld;
    const float a = alpha[h];
    // Scalar math: out[h] *= alpha[h]
#pragma omp simd
    for (int64_t col = 0; col < ld; ++col) row[col] *= a;
  }
}

// dkv | dcomp rows of batch element b = the sum of the per-thread accumulators [parts, Skv + T, ld],
// left zero for the next b (inside a parallel region: the rows are shared out).
template <class T>
void store_key_grads(T* dkv, T* dcomp, float* acc, int64_t parts, int64_t ld, int64_t b, const V4AttentionParams& d) {
  const int64_t key_rows = d.Skv + d.T;
#pragma omp for schedule(static)
  for (int64_t s = 0; s < key_rows; ++s) {
    T* dst = s < d.Skv ? dkv + (b * d.Skv + s) * d.D : dcomp + (b * d.T + s - d.Skv) * d.D;
    sum_partial_rows(dst, d.D, acc, s, key_rows, parts, ld);
  }
}

// dsink[h] = the per-thread partials [parts, Hs] summed in thread order.
void store_dsink(float* dsink, const double* partials, int64_t parts, int64_t H, int64_t Hs) {
  for (int64_t h = 0; h < H; ++h) {
    double sum = 0;
    for (int64_t part = 0; part < parts; ++part) sum += partials[part * Hs + h];
    dsink[h] = float(sum);
  }
}

#if defined(__AVX512BF16__)
// hm[i] for each slot i of sel = (1/H) sum over heads h < H of head h's softmax over the query's
// valid slots alone, from their scores cs [nc, Hs] (the valid slots in slot order; overwritten
// with the probabilities); 0 for invalid slots. lse and sum are [Hs] scratch.
void write_slot_head_mean(float* hm, float* cs, int64_t nc, int64_t Hs, float* lse, float* sum, const int32_t* sel,
                          int64_t t, const V4AttentionParams& d) {
  if (nc > 0) softmax_over_keys(cs, nc, Hs, lse, sum);
  const float inv_h = 1.0f / float(d.H);
  int64_t j = 0;
  for (int64_t i = 0; i < d.K; ++i) {
    if (!v4_slot_valid(d, sel[i], t)) {
      hm[i] = 0.0f;
      continue;
    }
    const float* row = cs + j++ * Hs;
    float total = 0.0f;
    // Scalar math: total += P[j, h]
#pragma omp simd reduction(+ : total)
    for (int64_t h = 0; h < d.H; ++h) total += row[h];
    hm[i] = total * inv_h;
  }
}

// One query at a time (the bf16 path): the keys query t sees, as rows of [kv | comp] of its batch
// element (raw key row j: j; entry w: Skv + w), to keys[0, n): its window's rows
// (v4_attention_params.h), then its compressed entries (HCA, sel nullptr: every visible one; CSA:
// the valid slots of sel, in slot order). Returns n >= 1.
int64_t list_keys(int32_t* keys, const int32_t* sel, int64_t t, const V4AttentionParams& d) {
  int64_t n = 0;
  for (int64_t j = v4_window_start(d, t); j <= v4_self_row(d, t); ++j) keys[n++] = int32_t(j);
  if (sel) {
    for (int64_t i = 0; i < d.K; ++i)
      if (v4_slot_valid(d, sel[i], t)) keys[n++] = int32_t(d.Skv + sel[i]);
  } else {
    const int64_t visible = v4_visible_entries(d, t);
    for (int64_t w = 0; w < visible; ++w) keys[n++] = int32_t(d.Skv + w);
  }
  return n;
}

// ---- bf16 on bf16 pairs (VDPBF16PS register tiles; D a multiple of 32) ----------------------------
// Same chunks, softmax and accumulation as the f32 path; the products take bf16 operands (the
// key rows as they are, q and dO packed by head, P and dS rounded to bf16, as FlashMLA does) and
// sum in f32. Against widening every operand to f32 this halves the bytes the products stream and
// doubles their rate per instruction.

// Copies the rows of keys[0, n) (bf16) to g[0, n) (rows D apart) and each pair of them,
// interleaved, to pairs[j] (rows ld apart; an odd last row pairs with 0s), and zeroes rows
// [n, round_up(n, kRows)) of g.
void gather_row_pairs(bf16* g, uint32_t* pairs, int64_t ld, const int32_t* keys, int64_t n, const bf16* kv,
                      const bf16* comp, const V4AttentionParams& d) {
  for (int64_t i = 0; i < n; ++i) {
    const bf16* src = keys[i] < d.Skv ? kv + int64_t(keys[i]) * d.D : comp + (int64_t(keys[i]) - d.Skv) * d.D;
    // memcpy: a loop of bf16 structs stays scalar 16-bit moves
    std::memcpy(g + i * d.D, src, size_t(d.D) * sizeof(bf16));
    if (i % 2 == 1) pack_row_pair(pairs + i / 2 * ld, g + (i - 1) * d.D, g + i * d.D, d.D);
  }
  if (n % 2 == 1) pack_row_pair(pairs + n / 2 * ld, g + (n - 1) * d.D, nullptr, d.D);
  std::memset(static_cast<void*>(g + n * d.D), 0, size_t((round_up(n, kRows) - n) * d.D) * sizeof(bf16));
}

void forward_bf16_pairs(bf16* o, float* lse, float* head_mean, const bf16* q, const bf16* kv, const bf16* comp,
                        const int32_t* idx, const float* sink, const V4AttentionParams& d) {
  const Plan p = make_plan(d, PlanFor::bf16_queries);
  const float scale = float(d.scale);
  const int64_t D2 = d.D / 2, K2 = round_up((p.chunk + 1) / 2, 16);
#pragma omp parallel
  {
    Scratch<bf16> g(p.chunk * d.D, ScratchInit::zeroed);        // [chunk, D] key rows
    Scratch<uint32_t> vb(K2 * p.Dp, ScratchInit::zeroed);       // [K2, Dp] key row pairs
    Scratch<uint32_t> qv(D2 * p.Hs, ScratchInit::zeroed);       // [D/2, Hs] q pairs by head
    Scratch<float> st(p.chunk * p.Hs, ScratchInit::zeroed);     // [chunk, Hs] scores, then exp(s - m)
    Scratch<uint32_t> pt(p.Hs * K2, ScratchInit::zeroed);       // [Hs, K2] exp(s - m) key pairs by head
    Scratch<float> out(p.Hs * p.Dp, ScratchInit::zeroed);       // [Hs, Dp] o rows, unnormalized
    Scratch<float> m(p.Hs, ScratchInit::zeroed), l(p.Hs, ScratchInit::zeroed), alpha(p.Hs, ScratchInit::zeroed);
    Scratch<int32_t> keys(p.most, ScratchInit::zeroed);
    const bool slots = head_mean && idx;
    Scratch<float> cs(slots ? d.K * p.Hs : 1), cm(slots ? p.Hs : 1), cl(slots ? p.Hs : 1);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bt = 0; bt < d.B * d.S; ++bt) {
      const int64_t b = bt / d.S, t = bt % d.S;
      const int64_t n = list_keys(keys.data(), idx ? idx + bt * d.K : nullptr, t, d);
      const int64_t window = v4_self_row(d, t) - v4_window_start(d, t) + 1;
      pack_heads_vnni(qv.data(), p.Hs, q + bt * d.H * d.D, d.H, d.D);
      start_softmax(m.data(), l.data(), sink, d.H, p.Hs);
      for (int64_t c0 = 0; c0 < n; c0 += p.chunk) {
        const int64_t cn = min_i64(p.chunk, n - c0);
        gather_row_pairs(g.data(), vb.data(), p.Dp, keys.data() + c0, cn, kv + b * d.Skv * d.D, comp + b * d.T * d.D,
                         d);
        // scores [cn, Hs] = rows . q (unscaled): bf16 row pairs x q pairs by head
        gemm<Tiles, TileStore::write>(st.data(), p.Hs, reinterpret_cast<const uint32_t*>(g.data()), D2, int64_t(1),
                                      qv.data(), p.Hs, round_up(cn, kRows), p.Hs, D2);
        for (int64_t i = 0; i < cn; ++i) {
          float* row = st.data() + i * p.Hs;
          // Scalar math: s = scale s
#pragma omp simd
          for (int64_t h = 0; h < p.Hs; ++h) row[h] *= scale;
          if (slots && c0 + i >= window) std::memcpy(cs.data() + (c0 + i - window) * p.Hs, row, size_t(p.Hs) * 4);
        }
        softmax_chunk(st.data(), cn, p.Hs, m.data(), l.data(), alpha.data());
        // exp(s - m) rounded to bf16 in key pairs, heads by pairs (an odd last key pairs with a 0)
        for (int64_t h0 = 0; h0 < p.Hs; h0 += 16)
          pack_pairs_transposed(pt.data() + h0 * K2, K2, st.data() + h0, p.Hs, cn, nullptr);
        if (c0 > 0) rescale_rows(out.data(), p.Dp, alpha.data(), d.H);
        // out (+)= P pairs [Hs, cn / 2] x key row pairs [cn / 2, Dp]
        if (c0 == 0) {
          gemm<Tiles, TileStore::write>(out.data(), p.Dp, pt.data(), K2, int64_t(1), vb.data(), p.Dp, p.Hs, p.Dp,
                                        (cn + 1) / 2);
        } else {
          gemm<Tiles, TileStore::accumulate>(out.data(), p.Dp, pt.data(), K2, int64_t(1), vb.data(), p.Dp, p.Hs, p.Dp,
                                             (cn + 1) / 2);
        }
      }
      for (int64_t h = 0; h < d.H; ++h) {
        lse[bt * d.H + h] = m.data()[h] + __builtin_logf(l.data()[h]);
        float* row = out.data() + h * p.Dp;
        const float inv = 1.0f / l.data()[h];
        // Scalar math: out[h] /= l[h]
#pragma omp simd
        for (int64_t col = 0; col < d.D; ++col) row[col] *= inv;
        store_bf16(o + (bt * d.H + h) * d.D, row, d.D);
      }
      if (slots) {
        write_slot_head_mean(head_mean + bt * d.K, cs.data(), n - window, p.Hs, cm.data(), cl.data(), idx + bt * d.K,
                             t, d);
      }
    }
  }
}

void backward_bf16_pairs(bf16* dq, bf16* dkv, bf16* dcomp, float* dsink, const bf16* dout, const bf16* q,
                         const bf16* kv, const bf16* comp, const int32_t* idx, const float* sink, const bf16* o,
                         const float* lse, float* acc, int64_t parts, const V4AttentionParams& d) {
  const Plan p = make_plan(d, PlanFor::bf16_queries);
  const int64_t w2 = 2 * p.Hs, key_rows = d.Skv + d.T;
  const int64_t D2 = d.D / 2, K2 = round_up((p.chunk + 1) / 2, 16);
  const float scale = float(d.scale);
  Scratch<double> dsink_parts(parts * p.Hs, ScratchInit::zeroed);
#pragma omp parallel num_threads(int(parts))
  {
    const int64_t me = omp_get_thread_num();
    float* mine = acc + me * key_rows * p.Dp;
    double* my_dsink = dsink_parts.data() + me * p.Hs;
    Scratch<bf16> g(p.chunk * d.D, ScratchInit::zeroed);        // [chunk, D] key rows
    Scratch<uint32_t> vq(K2 * p.Dp, ScratchInit::zeroed);       // [K2, Dp] key row pairs
    Scratch<uint32_t> qd(D2 * w2, ScratchInit::zeroed);         // [D/2, 2 Hs] (q | dO) pairs by head
    Scratch<uint32_t> b2(p.Hs * p.Dp, ScratchInit::zeroed);     // [Hs, Dp] (q ; dO) head pairs
    Scratch<float> st(p.chunk * w2, ScratchInit::zeroed);       // [chunk, 2 Hs] [scores | dA], then (scale dS | P)
    Scratch<bf16> ab(p.chunk * w2, ScratchInit::zeroed);        // [chunk, 2 Hs] (scale dS | P) in bf16
    Scratch<uint32_t> dst(p.Hs * K2, ScratchInit::zeroed);      // [Hs, K2] scale dS key pairs by head
    Scratch<float> dqb(p.Hs * p.Dp, ScratchInit::zeroed);       // [Hs, Dp] dq rows
    Scratch<float> lse_h(p.Hs, ScratchInit::zeroed), delta(p.Hs, ScratchInit::zeroed);
    Scratch<float> dummy(p.Dp, ScratchInit::zeroed);
    Scratch<int32_t> keys(p.most, ScratchInit::zeroed);
    Scratch<float*> c(p.chunk, ScratchInit::zeroed);
    for (int64_t h = d.H; h < p.Hs; ++h) lse_h.data()[h] = kInf;  // padding heads: P = 0
    for (int64_t b = 0; b < d.B; ++b) {
      // Round-robin queries, as the f32 path: the same bits on every run.
#pragma omp for schedule(static, 1)
      for (int64_t t = 0; t < d.S; ++t) {
        const int64_t bt = b * d.S + t;
        const int64_t n = list_keys(keys.data(), idx ? idx + bt * d.K : nullptr, t, d);
        const bf16* qh = q + bt * d.H * d.D;
        const bf16* doh = dout + bt * d.H * d.D;
        for (int64_t h = 0; h < d.H; ++h) {
          const float dl = dot_bf16(doh + h * d.D, o + (bt * d.H + h) * d.D, d.D);  // Delta = rowsum(dO * O)
          delta.data()[h] = dl;
          lse_h.data()[h] = lse[bt * d.H + h];
          if (sink) my_dsink[h] -= double(fast_exp(sink[h] - lse_h.data()[h])) * double(dl);
        }
        pack_heads_vnni(qd.data(), w2, qh, d.H, d.D);
        pack_heads_vnni(qd.data() + p.Hs, w2, doh, d.H, d.D);
        for (int64_t h = 0; h < d.H; h += 2) {  // head pairs of q, then of dO; padding pairs stay 0
          const bool odd = h + 1 == d.H;
          pack_row_pair(b2.data() + h / 2 * p.Dp, qh + h * d.D, odd ? nullptr : qh + (h + 1) * d.D, d.D);
          pack_row_pair(b2.data() + (p.Hs + h) / 2 * p.Dp, doh + h * d.D, odd ? nullptr : doh + (h + 1) * d.D, d.D);
        }
        for (int64_t c0 = 0; c0 < n; c0 += p.chunk) {
          const int64_t cn = min_i64(p.chunk, n - c0), cn_pad = round_up(cn, kRows);
          gather_row_pairs(g.data(), vq.data(), p.Dp, keys.data() + c0, cn, kv + b * d.Skv * d.D, comp + b * d.T * d.D,
                           d);
          // [S^T | dA^T][i] = rows[i] . (q | dO), unscaled
          gemm<Tiles, TileStore::write>(st.data(), w2, reinterpret_cast<const uint32_t*>(g.data()), D2, int64_t(1),
                                        qd.data(), w2, cn_pad, w2, D2);
          for (int64_t i = 0; i < cn; ++i) {
            float* row = st.data() + i * w2;
            // Scalar math: s = scale s
#pragma omp simd
            for (int64_t h = 0; h < p.Hs; ++h) row[h] *= scale;
          }
          scores_to_grads(st.data(), cn, p.Hs, lse_h.data(), delta.data(), scale);
          // Scalar math: ab = bf16(st), padding rows (0 | 0) included
          for (int64_t i = 0; i < cn_pad; ++i) store_bf16(ab.data() + i * w2, st.data() + i * w2, w2);
          // dq (+)= (scale dS)^T rows: scale dS in bf16 key pairs by head times the row pairs
          for (int64_t h0 = 0; h0 < p.Hs; h0 += 16)
            pack_pairs_transposed(dst.data() + h0 * K2, K2, st.data() + h0, w2, cn, nullptr);
          if (c0 == 0) {
            gemm<Tiles, TileStore::write>(dqb.data(), p.Dp, dst.data(), K2, int64_t(1), vq.data(), p.Dp, p.Hs, p.Dp,
                                          (cn + 1) / 2);
          } else {
            gemm<Tiles, TileStore::accumulate>(dqb.data(), p.Dp, dst.data(), K2, int64_t(1), vq.data(), p.Dp, p.Hs,
                                               p.Dp, (cn + 1) / 2);
          }
          // key rows[key_i] += (scale dS | P)[i] (q ; dO): [cn, 2 Hs] bf16 (Hs pairs) x [Hs pair rows, Dp]
          for (int64_t r = 0; r < cn_pad; ++r)
            c.data()[r] = r < cn ? mine + int64_t(keys.data()[c0 + r]) * p.Dp : dummy.data();
          gemm_add_rows<Tiles>(c.data(), reinterpret_cast<const uint32_t*>(ab.data()), p.Hs, int64_t(1), b2.data(),
                               p.Dp, cn_pad, p.Dp, p.Hs);
        }
        for (int64_t h = 0; h < d.H; ++h) store_bf16(dq + (bt * d.H + h) * d.D, dqb.data() + h * p.Dp, d.D);
      }
      store_key_grads(dkv, dcomp, acc, parts, p.Dp, b, d);
    }
  }
  if (sink) store_dsink(dsink, dsink_parts.data(), parts, d.H, p.Hs);
}
#endif

}  // namespace

int64_t v4_attention_acc_width(int64_t d) { return round_up(d, kPadLanes); }

template <class T>
void v4_attention_forward(T* o, float* lse, float* head_mean, const T* q, const T* kv, const T* comp,
                          const int32_t* idx, const float* sink, const V4AttentionParams& d) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (d.D % 32 == 0) return forward_bf16_pairs(o, lse, head_mean, q, kv, comp, idx, sink, d);
  }
#endif
  const Plan p = make_plan(d);
  const float scale = float(d.scale);
  const int64_t Q = p.Q, cols = Q * d.H, blocks = (d.S + Q - 1) / Q;
#pragma omp parallel
  {
    // Per-thread buffers of one block, zero-initialized so every padding lane is a finite 0.
    Scratch<float> g(p.chunk * p.Dp, ScratchInit::zeroed);  // [chunk, Dp] key rows, f32
    Scratch<float> qt(d.D * p.Hs, ScratchInit::zeroed);     // [D, Hs] scale * q^T, column qi H + h
    // [chunk + 1, Hs] scores, then exp(s - m), key by column; the extra row covers the padding
    // rows of the output tile, which read up to Hr - Hs < 16 floats past the last key.
    Scratch<float> st((p.chunk + 1) * p.Hs, ScratchInit::zeroed);
    Scratch<float> out(p.Hr * p.Dp, ScratchInit::zeroed);  // [Hr, Dp] o rows, unnormalized
    // [Hs] per column: the running max and sum, the chunk's rescale factor
    Scratch<float> m(p.Hs, ScratchInit::zeroed), l(p.Hs, ScratchInit::zeroed), alpha(p.Hs, ScratchInit::zeroed);
    Scratch<float> sink_cols(p.Hs, ScratchInit::zeroed);  // the sink of each column's head
    Scratch<int32_t> keys(p.most, ScratchInit::zeroed);
    Scratch<float> bias(p.most * Q, ScratchInit::zeroed);
    for (int64_t c = 0; sink && c < cols; ++c) sink_cols.data()[c] = sink[c % d.H];
    std::optional<EntryScratch> entries;  // CSA: one query's entries
    if (idx) entries.emplace(d, p.Dp, false, std::is_same_v<T, float>);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bk = 0; bk < d.B * blocks; ++bk) {
      const int64_t b = bk / blocks, t0 = bk % blocks * Q, nq = min_i64(Q, d.S - t0);
      const T* kvb = kv + b * d.Skv * d.D;
      const T* compb = comp + b * d.T * d.D;
      const int64_t n = block_keys(keys.data(), bias.data(), d.K > 0, t0, nq, Q, d);  // K > 0 iff idx (v4_dims)
      // Columns of queries past the last (nq < Q) keep the previous block's q: finite, every key
      // biased away, never stored.
      for (int64_t qi = 0; qi < nq; ++qi)
        transpose_heads(qt.data() + qi * d.H, p.Hs, q + (b * d.S + t0 + qi) * d.H * d.D, d.D, d.H, d.D, scale);
      start_softmax(m.data(), l.data(), sink ? sink_cols.data() : nullptr, cols, p.Hs);
      // Key chunks: scores [cn, Hs] = rows x (scale q)^T (+ bias), the online softmax, and
      // out = alpha out + exp(s - m)^T rows ([Hr, cn] read transposed x [cn, Dp]).
      for (int64_t c0 = 0; c0 < n; c0 += p.chunk) {
        const int64_t cn = min_i64(p.chunk, n - c0);
        gather_rows(g.data(), p.Dp, keys.data() + c0, cn, kvb, compb, d);
        gemm<Tiles, TileStore::write>(st.data(), p.Hs, g.data(), p.Dp, 1, qt.data(), p.Hs, round_up(cn, kRows), p.Hs,
                                      d.D);
        add_bias(st.data(), p.Hs, bias.data(), c0, cn, Q, d.H);
        softmax_chunk(st.data(), cn, p.Hs, m.data(), l.data(), alpha.data());
        if (c0 == 0) {
          gemm<Tiles, TileStore::write>(out.data(), p.Dp, st.data(), 1, p.Hs, g.data(), p.Dp, p.Hr, p.Dp, cn);
          continue;
        }
        rescale_rows(out.data(), p.Dp, alpha.data(), cols);
        gemm<Tiles, TileStore::accumulate>(out.data(), p.Dp, st.data(), 1, p.Hs, g.data(), p.Dp, p.Hr, p.Dp, cn);
      }
      for (int64_t qi = 0; idx && qi < nq; ++qi) {
        const int64_t bt = b * d.S + t0 + qi;
        const int32_t* sel = idx + bt * d.K;
        float* hm = head_mean ? head_mean + bt * d.K : nullptr;
        const int64_t ne = gather_entries(entries->buf, sel, t0 + qi, compb, d);
        if (ne > 0) {
          forward_entries(out.data(), m.data(), l.data(), qt.data(), p.Hs, qi * d.H, entries->buf, ne, hm, sel, t0 + qi,
                          d);
        } else if (hm) {
          for (int64_t i = 0; i < d.K; ++i) hm[i] = 0.0f;
        }
      }
      for (int64_t qi = 0; qi < nq; ++qi) {
        const int64_t bt = b * d.S + t0 + qi;
        T* ot = o + bt * d.H * d.D;
        for (int64_t h = 0; h < d.H; ++h) {
          const int64_t col = qi * d.H + h;
          // the libm call, not a wrapper shared across ISAs; every query sees its own key: l > 0
          lse[bt * d.H + h] = m.data()[col] + __builtin_logf(l.data()[col]);
          const float inv = 1.0f / l.data()[col];
          // Scalar math: o[h] = out[col] / l[col]; the sink has no value
#pragma omp simd
          for (int64_t c = 0; c < d.D; ++c) ot[h * d.D + c] = from_f32<T>(inv * out.data()[col * p.Dp + c]);
        }
      }
    }
  }
}

template <class T>
void v4_attention_backward(T* dq, T* dkv, T* dcomp, float* dsink, const T* dout, const T* q, const T* kv,
                           const T* comp, const int32_t* idx, const float* sink, const T* o, const float* lse,
                           float* acc, int64_t parts, const V4AttentionParams& d) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if (d.D % 32 == 0) return backward_bf16_pairs(dq, dkv, dcomp, dsink, dout, q, kv, comp, idx, sink, o, lse, acc, parts, d);
  }
#endif
  const Plan p = make_plan(d);
  const int64_t w2 = 2 * p.Hs;         // [scale dS | P] and [scores | dA] columns: the block's, then again
  const int64_t key_rows = d.Skv + d.T;  // accumulator rows per batch element: raw keys, then entries
  const int64_t Q = p.Q, blocks = (d.S + Q - 1) / Q;
  const float scale = float(d.scale);
  // Each thread's dsink partial (in f64: a sum over every query), summed in thread order below.
  Scratch<double> dsink_parts(parts * p.Hs, ScratchInit::zeroed);
#pragma omp parallel num_threads(int(parts))
  {
    const int64_t me = omp_get_thread_num();
    float* mine = acc + me * key_rows * p.Dp;  // this thread's key-row gradients, f32
    double* my_dsink = dsink_parts.data() + me * p.Hs;
    Scratch<float> g(p.chunk * p.Dp, ScratchInit::zeroed);       // [chunk, Dp] key rows
    Scratch<float> qdt(d.D * w2, ScratchInit::zeroed);           // [D, 2 Hs] (scale q^T | dO^T), column qi H + h
    Scratch<float> b2(w2 * p.Dp, ScratchInit::zeroed);           // [2 Hs, Dp] (q ; dO)
    Scratch<float> st((p.chunk + 1) * w2, ScratchInit::zeroed);  // [chunk + 1, 2 Hs] see the forward's st
    Scratch<float> dqb(p.Hr * p.Dp, ScratchInit::zeroed);        // [Hr, Dp] dq rows
    Scratch<float> lse_c(p.Hs, ScratchInit::zeroed), delta(p.Hs, ScratchInit::zeroed);  // [Hs] per column
    Scratch<float> dummy(p.Dp, ScratchInit::zeroed);             // C row of padding rows, never read
    Scratch<int32_t> keys(p.most, ScratchInit::zeroed);
    Scratch<float> bias(p.most * Q, ScratchInit::zeroed);
    Scratch<float*> c(p.chunk, ScratchInit::zeroed);  // C rows of the key-gradient product
    std::optional<EntryScratch> entries;                         // CSA: one query's entries
    if (idx) entries.emplace(d, p.Dp, true, std::is_same_v<T, float>);
    for (int64_t b = 0; b < d.B; ++b) {
      const T* kvb = kv + b * d.Skv * d.D;
      const T* compb = comp + b * d.T * d.D;
      // Blocks dealt round-robin, not dynamically: each thread's partials then sum the same
      // queries in the same order on every call, so the gradients do not vary run to run.
#pragma omp for schedule(static, 1)
      for (int64_t blk = 0; blk < blocks; ++blk) {
        const int64_t t0 = blk * Q, nq = min_i64(Q, d.S - t0);
        const int64_t n = block_keys(keys.data(), bias.data(), d.K > 0, t0, nq, Q, d);  // K > 0 iff idx (v4_dims)
        // Padding columns, and those of queries past the last (nq < Q): P = 0.
        for (int64_t col = nq * d.H; col < p.Hs; ++col) lse_c.data()[col] = kInf;
        for (int64_t qi = 0; qi < nq; ++qi) {
          const int64_t bt = b * d.S + t0 + qi;
          const T* qh = q + bt * d.H * d.D;
          const T* doh = dout + bt * d.H * d.D;
          const T* oh = o + bt * d.H * d.D;
          transpose_heads(qdt.data() + qi * d.H, w2, qh, d.D, d.H, d.D, scale);
          transpose_heads(qdt.data() + p.Hs + qi * d.H, w2, doh, d.D, d.H, d.D, 1.0f);
          for (int64_t h = 0; h < d.H; ++h) {
            const int64_t col = qi * d.H + h;
            float* b2q = b2.data() + col * p.Dp;
            float* b2d = b2.data() + (p.Hs + col) * p.Dp;
            float dl = 0;  // Delta = rowsum(dO * O)
            // Scalar math: Delta += dO o; b2 rows = (q ; dO)
#pragma omp simd reduction(+ : dl)
            for (int64_t k = 0; k < d.D; ++k) {
              const float dov = to_f32(doh[h * d.D + k]);
              dl += dov * to_f32(oh[h * d.D + k]);
              b2d[k] = dov;
              b2q[k] = to_f32(qh[h * d.D + k]);
            }
            delta.data()[col] = dl;
            lse_c.data()[col] = lse[bt * d.H + h];
            // The sink joins the softmax with no value: dsink = p_sink (0 - Delta).
            if (sink) my_dsink[h] -= double(fast_exp(sink[h] - lse_c.data()[col])) * double(dl);
          }
        }
        // Key chunks; P comes from lse, so they are independent but for dq's sum.
        for (int64_t c0 = 0; c0 < n; c0 += p.chunk) {
          const int64_t cn = min_i64(p.chunk, n - c0), cn_pad = round_up(cn, kRows);
          gather_rows(g.data(), p.Dp, keys.data() + c0, cn, kvb, compb, d);
          // [S^T | dA^T][i] = rows[i] . (scale q | dO): one [cn, D] x [D, 2 Hs] product.
          gemm<Tiles, TileStore::write>(st.data(), w2, g.data(), p.Dp, 1, qdt.data(), w2, cn_pad, w2, d.D);
          add_bias(st.data(), w2, bias.data(), c0, cn, Q, d.H);
          // P recomputed from lse; the row becomes (scale dS | P), the A operand of dq and the keys.
          scores_to_grads(st.data(), cn, p.Hs, lse_c.data(), delta.data(), scale);
          // dq[col] (+)= sum_i scale dS[i, col] rows[i]: [Hr, cn] (read transposed) x [cn, Dp]
          if (c0 == 0) {
            gemm<Tiles, TileStore::write>(dqb.data(), p.Dp, st.data(), 1, w2, g.data(), p.Dp, p.Hr, p.Dp, cn);
          } else {
            gemm<Tiles, TileStore::accumulate>(dqb.data(), p.Dp, st.data(), 1, w2, g.data(), p.Dp, p.Hr, p.Dp, cn);
          }
          // key rows[key_i] += (scale dS | P)[i] (q ; dO): key and value roles in one [cn, 2 Hs] x
          // [2 Hs, Dp] product, added straight into this thread's rows of the keys.
          for (int64_t r = 0; r < cn_pad; ++r)
            c.data()[r] = r < cn ? mine + int64_t(keys.data()[c0 + r]) * p.Dp : dummy.data();
          gemm_add_rows<Tiles>(c.data(), st.data(), w2, 1, b2.data(), p.Dp, cn_pad, p.Dp, w2);
        }
        for (int64_t qi = 0; idx && qi < nq; ++qi) {
          const int64_t bt = b * d.S + t0 + qi, col0 = qi * d.H;
          const int64_t ne = gather_entries(entries->buf, idx + bt * d.K, t0 + qi, compb, d);
          if (ne == 0) continue;
          backward_entries(dqb.data(), mine, dummy.data(), entries->rows(), qdt.data(), w2, p.Hs, col0,
                           b2.data() + col0 * p.Dp, b2.data() + (p.Hs + col0) * p.Dp, lse_c.data(), delta.data(),
                           scale, entries->buf, ne, d);
        }
        for (int64_t qi = 0; qi < nq; ++qi) {
          T* dqt = dq + (b * d.S + t0 + qi) * d.H * d.D;
          for (int64_t h = 0; h < d.H; ++h) {
            const float* row = dqb.data() + (qi * d.H + h) * p.Dp;
            // Scalar math: dq[h] = dqb[col]
#pragma omp simd
            for (int64_t k = 0; k < d.D; ++k) dqt[h * d.D + k] = from_f32<T>(row[k]);
          }
        }
      }
      // (barrier) dkv | dcomp = the sum of the per-thread accumulators, zeroed for the next b.
      store_key_grads(dkv, dcomp, acc, parts, p.Dp, b, d);
    }
  }
  if (sink) store_dsink(dsink, dsink_parts.data(), parts, d.H, p.Hs);
}

#define TITAN_INSTANTIATE(T)                                                                                          \
  template void v4_attention_forward<T>(T*, float*, float*, const T*, const T*, const T*, const int32_t*,            \
                                        const float*, const V4AttentionParams&);                                      \
  template void v4_attention_backward<T>(T*, T*, T*, float*, const T*, const T*, const T*, const T*, const int32_t*,  \
                                         const float*, const T*, const float*, float*, int64_t,                       \
                                         const V4AttentionParams&);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
