// Flash attention on the CPU, FlashAttention-2 blocking: a block of kBlock query rows stays
// resident while key/value blocks stream past, and scores only ever exist as kBlock x kBlock
// tiles (held transposed, keys by queries; see the forward). Every product is a register-tiled
// f32 micro-kernel over packed, zero-padded buffers.
// bf16 inputs are widened to f32 once, while packing (O(S D) work against O(S^2 D) products):
// on the Xeon this was tuned on, VDPBF16PS runs at half the f32 FMA rate, so f32 FMA is the
// faster way to multiply bf16 there.
#include "titan/kernels/cpu/attention.h"

#include <omp.h>

#include "titan/core/allocator.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

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
// Packed widths are padded to a multiple of 16 floats: whole vectors at every ISA level.
constexpr int64_t kLanes = 16;

// Register tile over vecf (cpu/isa.h): kRows x kVecs accumulators plus kVecs loaded B vectors and
// one broadcast fit the register file (32 zmm; 16 ymm or xmm otherwise).
#if defined(__AVX512F__)
constexpr int kRows = 6, kVecs = 4;
#elif defined(__AVX2__)
constexpr int kRows = 6, kVecs = 2;
#else
constexpr int kRows = 4, kVecs = 2;
#endif
typedef int32_t veci __attribute__((vector_size(sizeof(int32_t) * kVecLanes)));

TITAN_INLINE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

TITAN_INLINE vecf splat(float x) { return vecf{} + x; }
TITAN_INLINE vecf loadv(const float* p) { return *reinterpret_cast<const vecf*>(p); }
TITAN_INLINE void storev(float* p, vecf x) { *reinterpret_cast<vecf*>(p) = x; }
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
TITAN_INLINE int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// ---- micro-kernel ---------------------------------------------------------------------------
// c[r][0, n) (+)= sum_k a(r, k) b[k][0, n) for r < Rows, n = Vecs * kVecLanes, with a(r, k) =
// a[r * a_row + k * a_k] (so A may be read transposed: P^T, dS^T) and b rows ldb floats apart.
// Accumulators live in registers for the whole k loop.
template <int Rows, int Vecs, bool kAccumulate>
TITAN_INLINE void gemm_tile(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b,
                            int64_t ldb, int64_t K) {
  vecf acc[Rows][Vecs];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      if constexpr (kAccumulate) {
        acc[r][v] = *reinterpret_cast<const vecf*>(c + r * ldc + v * kVecLanes);
      } else {
        acc[r][v] = vecf{};
      }
    }
  }
  // Two k steps per iteration: the pointer updates and loop branch are then spread over twice
  // the FMAs (measured a few percent at S = 2048, within this shared machine's noise).
#pragma GCC unroll 2
  for (int64_t kk = 0; kk < K; ++kk) {
    vecf bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) bv[v] = *reinterpret_cast<const vecf*>(b + kk * ldb + v * kVecLanes);
#pragma GCC unroll 8
    for (int r = 0; r < Rows; ++r) {
      const float ar = a[r * a_row + kk * a_k];
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) *reinterpret_cast<vecf*>(c + r * ldc + v * kVecLanes) = acc[r][v];
  }
}

// One column strip of Vecs vectors, all M rows: full kRows tiles, then one shorter tile.
template <int Rows, int Vecs, bool kAccumulate>
TITAN_INLINE void gemm_row_tail(int64_t rows, float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k,
                                const float* b, int64_t ldb, int64_t K) {
  if (rows == Rows) {
    gemm_tile<Rows, Vecs, kAccumulate>(c, ldc, a, a_row, a_k, b, ldb, K);
  } else if constexpr (Rows > 1) {
    gemm_row_tail<Rows - 1, Vecs, kAccumulate>(rows, c, ldc, a, a_row, a_k, b, ldb, K);
  }
}

template <int Vecs, bool kAccumulate>
void gemm_strip(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb,
                int64_t M, int64_t K) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows) {
    gemm_tile<kRows, Vecs, kAccumulate>(c + m * ldc, ldc, a + m * a_row, a_row, a_k, b, ldb, K);
  }
  if (m < M) gemm_row_tail<kRows, Vecs, kAccumulate>(M - m, c + m * ldc, ldc, a + m * a_row, a_row, a_k, b, ldb, K);
}

template <int Vecs, bool kAccumulate>
void gemm_strip_tail(int64_t vecs, float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b,
                     int64_t ldb, int64_t M, int64_t K) {
  if (vecs == Vecs) {
    gemm_strip<Vecs, kAccumulate>(c, ldc, a, a_row, a_k, b, ldb, M, K);
  } else if constexpr (Vecs > 1) {
    gemm_strip_tail<Vecs - 1, kAccumulate>(vecs, c, ldc, a, a_row, a_k, b, ldb, M, K);
  }
}

// C[M, N] (+)= A(M x K) B[K, N] with A(r, k) = a[r * a_row + k * a_k]. N is a multiple of 16:
// every B operand and C tile is a packed buffer padded to that width. The B strip (K rows of
// kVecs vectors) stays in L1 while the row tiles run over it.
template <bool kAccumulate>
void gemm(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb, int64_t M,
          int64_t N, int64_t K) {
  for (int64_t n = 0; n < N; n += kVecs * kVecLanes) {
    const int64_t vecs = min_i64((N - n) / kVecLanes, kVecs);
    gemm_strip_tail<kVecs, kAccumulate>(vecs, c + n, ldc, a, a_row, a_k, b + n, ldb, M, K);
  }
}

// ---- packing --------------------------------------------------------------------------------
// Sizes derived from AttentionDims, shared by forward and backward.
struct Plan {
  int64_t group;    // query heads per kv head
  int64_t nblk;     // query (and key) blocks per sequence
  int64_t s_pad;    // nblk * kBlock
  int64_t dqk_pad;  // Dqk rounded up to 16
  int64_t dv_pad;   // Dv rounded up to 16
};

Plan make_plan(const AttentionDims& d) {
  Plan p;
  p.group = d.H / d.Hkv;
  p.nblk = (d.S + kBlock - 1) / kBlock;
  p.s_pad = p.nblk * kBlock;
  p.dqk_pad = round_up(d.Dqk, kLanes);
  p.dv_pad = round_up(d.Dv, kLanes);
  return p;
}

// dst[j][c] = scale * src[j][c] for j < rows, c < width, and 0 for width <= c < ld_dst (the
// padding that micro-kernels read as B-operand columns).
template <class T>
void pack_rows(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t width, float scale) {
  for (int64_t j = 0; j < rows; ++j) {
    const T* row = src + j * ld_src;
    float* out = dst + j * ld_dst;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) out[c] = scale * to_f32(row[c]);
    for (int64_t c = width; c < ld_dst; ++c) out[c] = 0.0f;
  }
}

// dst[c][j] = scale * src[j][c] for one block of rows: the B operand whose columns are queries.
// Columns j >= rows are zeroed. dst [width, kBlock]. Sixteen source rows at a time, so each
// store is one contiguous vector and the sixteen rows being read stay in L1.
template <class T>
void pack_transposed(float* dst, const T* src, int64_t ld_src, int64_t rows, int64_t width, float scale) {
  for (int64_t j0 = 0; j0 < kBlock; j0 += kLanes) {
    const int64_t n = min_i64(kLanes, rows - j0);
    for (int64_t c = 0; c < width; ++c) {
      float col[kLanes] = {};
      for (int64_t jj = 0; jj < n; ++jj) col[jj] = scale * to_f32(src[(j0 + jj) * ld_src + c]);
      std::memcpy(dst + c * kBlock + j0, col, sizeof(col));
    }
  }
}

// Keys and values of every (b, kv head) as f32 rows, packed once (in parallel, padding included,
// so the buffers need no serial zero-fill) and shared by all query heads of the group:
// kp [B, Hkv, s_pad, dqk_pad], vp [B, Hkv, s_pad, dv_pad]. Rows past S are never read: every
// product over keys stops at the last valid key.
template <class T>
void pack_kv(float* kp, float* vp, const T* k, const T* v, const AttentionDims& d, const Plan& p) {
  const int64_t items = d.B * d.Hkv * p.nblk;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < items; ++t) {
    const int64_t blk = t % p.nblk, bg = t / p.nblk, b = bg / d.Hkv, g = bg % d.Hkv;
    const int64_t row0 = blk * kBlock, rows = min_i64(kBlock, d.S - row0);
    pack_rows(kp + (bg * p.s_pad + row0) * p.dqk_pad, p.dqk_pad, k + ((b * d.S + row0) * d.Hkv + g) * d.Dqk,
              d.Hkv * d.Dqk, rows, d.Dqk, 1.0f);
    pack_rows(vp + (bg * p.s_pad + row0) * p.dv_pad, p.dv_pad, v + ((b * d.S + row0) * d.Hkv + g) * d.Dv,
              d.Hkv * d.Dv, rows, d.Dv, 1.0f);
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
void add_group_sum(T* out, float* sum, const float* part, int64_t stride, int64_t heads, int64_t width) {
  std::memcpy(sum, part, size_t(width) * sizeof(float));
  for (int64_t h = 1; h < heads; ++h) {
    const float* x = part + h * stride;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) sum[c] += x[c];
  }
#pragma omp simd
  for (int64_t c = 0; c < width; ++c) out[c] = from_f32<T>(to_f32(out[c]) + sum[c]);
}

}  // namespace

// ---- forward ----------------------------------------------------------------------------------
// Scores are computed transposed, S^T = k q^T (keys down, the block's queries across), so the
// softmax over keys is element-wise across rows: running max, exp and sum are plain vector ops
// with no horizontal reductions, and the P^T tile feeds o += P v as a transposed A operand.
template <class T>
void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v, const AttentionDims& d) {
  const Plan p = make_plan(d);
  Scratch<float> kp(d.B * d.Hkv * p.s_pad * p.dqk_pad);  // [B, Hkv, s_pad, dqk_pad]
  Scratch<float> vp(d.B * d.Hkv * p.s_pad * p.dv_pad);   // [B, Hkv, s_pad, dv_pad]
  pack_kv<T>(kp.data(), vp.data(), k, v, d, p);

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
        const float* kp_blk = kp.data() + (bg * p.s_pad + kb * kBlock) * p.dqk_pad;  // [kBlock, dqk_pad]
        const float* vp_blk = vp.data() + (bg * p.s_pad + kb * kBlock) * p.dv_pad;   // [kBlock, dv_pad]
        for (int64_t qb = kb > qb0 ? kb : qb0; qb < qb_end; ++qb) {
          const int64_t x = qb - qb0, rows = min_i64(kBlock, d.S - qb * kBlock);
          float* m_x = m.data() + x * kBlock;                // [kBlock]
          float* l_x = l.data() + x * kBlock;                // [kBlock]
          float* oacc_x = oacc.data() + x * kBlock * p.dv_pad;  // [kBlock, dv_pad]
          const bool diagonal = kb == qb;
          const int64_t cols = diagonal ? rows : kBlock;  // keys past the diagonal or past S are skipped
          gemm<false>(st.data(), kBlock, kp_blk, p.dqk_pad, 1, qt.data() + x * d.Dqk * kBlock, kBlock, cols, kBlock,
                      d.Dqk);
          if (diagonal) mask_diagonal(st.data(), cols);
          // Online softmax per query column: new max, rescale of the old sum (and of o below),
          // P^T = exp(S^T - max). Padding queries past S compute finite values nobody reads.
          for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
            vecf mx = loadv(st.data() + v0);
            for (int64_t j = 1; j < cols; ++j) mx = maxv(mx, loadv(st.data() + j * kBlock + v0));
            const vecf m_old = loadv(m_x + v0), m_new = maxv(m_old, mx);
            const vecf a = exp_v(m_old - m_new);
            vecf sum = vecf{};
            for (int64_t j = 0; j < cols; ++j) {
              const vecf pj = exp_v(loadv(st.data() + j * kBlock + v0) - m_new);
              storev(st.data() + j * kBlock + v0, pj);
              sum += pj;
            }
            storev(l_x + v0, loadv(l_x + v0) * a + sum);
            storev(m_x + v0, m_new);
            storev(alpha.data() + v0, a);
          }
          for (int64_t i = 0; i < rows; ++i) {
            const float a = alpha.data()[i];
            if (a == 1.0f) continue;
            float* orow = oacc_x + i * p.dv_pad;
            for (int64_t c = 0; c < p.dv_pad; c += kVecLanes) storev(orow + c, loadv(orow + c) * a);
          }
          // o += P v with A(i, j) = P^T[j][i]
          gemm<true>(oacc_x, p.dv_pad, st.data(), 1, kBlock, vp_blk, p.dv_pad, rows, p.dv_pad, cols);
        }
      }

      for (int64_t qb = qb0; qb < qb_end; ++qb) {
        const int64_t x = qb - qb0, row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        for (int64_t i = 0; i < rows; ++i) {
          const float sum = l.data()[x * kBlock + i], inv = 1.0f / sum;
          const float* orow = oacc.data() + (x * kBlock + i) * p.dv_pad;
          T* out = o + ((b * d.S + row0 + i) * d.H + h) * d.Dv;
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
// over each GQA group in head order afterwards. Every sum therefore runs in a fixed order and the
// result does not depend on scheduling. Tiles are transposed as in
// the forward: S^T = k q^T, dP^T = v dO^T, with the per-query lse and D_i across vector lanes.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const float* lse, const T* dout, const T* q, const T* k, const T* v,
                        const T* o, const AttentionDims& d) {
  const Plan p = make_plan(d);
  Scratch<float> kp(d.B * d.Hkv * p.s_pad * p.dqk_pad);  // [B, Hkv, s_pad, dqk_pad]
  Scratch<float> vp(d.B * d.Hkv * p.s_pad * p.dv_pad);   // [B, Hkv, s_pad, dv_pad]
  pack_kv<T>(kp.data(), vp.data(), k, v, d, p);
  Scratch<float> dk_part(d.B * d.H * d.S * d.Dqk);  // [B, H, S, Dqk] this head's share of dk
  Scratch<float> dv_part(d.B * d.H * d.S * d.Dv);   // [B, H, S, Dv]

  const float scale = float(d.scale);
  const int64_t heads = d.B * d.H;
  // Threads beyond one per head would only allocate and zero their per-head buffers.
  const int threads = heads < omp_get_max_threads() ? int(heads) : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
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
      pack_rows(qs.data(), p.dqk_pad, q_h, d.H * d.Dqk, d.S, d.Dqk, scale);
      pack_rows(dos.data(), p.dv_pad, do_h, d.H * d.Dv, d.S, d.Dv, 1.0f);
      for (int64_t qb = 0; qb < p.nblk; ++qb) {
        const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
        pack_transposed(qt.data() + qb * d.Dqk * kBlock, q_h + row0 * d.H * d.Dqk, d.H * d.Dqk, rows, d.Dqk, scale);
        pack_transposed(dot.data() + qb * d.Dv * kBlock, do_h + row0 * d.H * d.Dv, d.H * d.Dv, rows, d.Dv, 1.0f);
      }
      for (int64_t i = 0; i < d.S; ++i) {
        const T* orow = o + ((b * d.S + i) * d.H + h) * d.Dv;
        const float* dorow = dos.data() + i * p.dv_pad;
        float sum = 0;
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
            const float* kp_blk = kp.data() + (bg * p.s_pad + col0) * p.dqk_pad;  // [kBlock, dqk_pad]
            const float* vp_blk = vp.data() + (bg * p.s_pad + col0) * p.dv_pad;   // [kBlock, dv_pad]
            float* dk_blk = dk_acc.data() + (kb - kb0) * kBlock * p.dqk_pad;     // [kBlock, dqk_pad]
            float* dv_blk = dv_acc.data() + (kb - kb0) * kBlock * p.dv_pad;      // [kBlock, dv_pad]
            // P^T = exp(S^T - lse) with S^T = k (scale q)^T; -inf above the diagonal gives 0.
            gemm<false>(pt.data(), kBlock, kp_blk, p.dqk_pad, 1, qt_blk, kBlock, cols, kBlock, d.Dqk);
            if (diagonal) mask_diagonal(pt.data(), cols);
            for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
              const vecf lse_v = loadv(lse_p.data() + row0 + v0);
              for (int64_t j = 0; j < cols; ++j) {
                float* x = pt.data() + j * kBlock + v0;
                storev(x, exp_v(loadv(x) - lse_v));
              }
            }
            // dv += P^T dO
            gemm<true>(dv_blk, p.dv_pad, pt.data(), kBlock, 1, dos_blk, p.dv_pad, cols, p.dv_pad, rows);
            // dP^T = v dO^T, then dS^T = P^T (dP^T - D)
            gemm<false>(dst.data(), kBlock, vp_blk, p.dv_pad, 1, dot_blk, kBlock, cols, kBlock, d.Dv);
            for (int64_t v0 = 0; v0 < kBlock; v0 += kVecLanes) {
              const vecf delta_v = loadv(delta.data() + row0 + v0);
              for (int64_t j = 0; j < cols; ++j) {
                float* x = dst.data() + j * kBlock + v0;
                storev(x, loadv(pt.data() + j * kBlock + v0) * (loadv(x) - delta_v));
              }
            }
            // dk += scale dS^T q (qs carries the scale); dq += dS k (scaled once at the end)
            gemm<true>(dk_blk, p.dqk_pad, dst.data(), kBlock, 1, qs_blk, p.dqk_pad, cols, p.dqk_pad, rows);
            gemm<true>(dq_blk, p.dqk_pad, dst.data(), 1, kBlock, kp_blk, p.dqk_pad, rows, p.dqk_pad, cols);
          }
        }
        for (int64_t j = kb0 * kBlock; j < min_i64(d.S, kb_end * kBlock); ++j) {
          std::memcpy(dk_part.data() + (bh * d.S + j) * d.Dqk, dk_acc.data() + (j - kb0 * kBlock) * p.dqk_pad,
                      size_t(d.Dqk) * sizeof(float));
          std::memcpy(dv_part.data() + (bh * d.S + j) * d.Dv, dv_acc.data() + (j - kb0 * kBlock) * p.dv_pad,
                      size_t(d.Dv) * sizeof(float));
        }
      }
      for (int64_t i = 0; i < d.S; ++i) {
        T* out = dq + ((b * d.S + i) * d.H + h) * d.Dqk;
        const float* acc = dq_acc.data() + i * p.dqk_pad;
#pragma omp simd
        for (int64_t c = 0; c < d.Dqk; ++c) out[c] = from_f32<T>(to_f32(out[c]) + scale * acc[c]);
      }
    }

    // dk, dv += sum over the group's heads of their partials, in head order.
    Scratch<float> row_sum(p.dqk_pad > p.dv_pad ? p.dqk_pad : p.dv_pad, ScratchInit::zeroed);
#pragma omp for schedule(static)
    for (int64_t bs = 0; bs < d.B * d.S; ++bs) {
      const int64_t b = bs / d.S, i = bs % d.S;
      for (int64_t g = 0; g < d.Hkv; ++g) {
        add_group_sum(dk + (bs * d.Hkv + g) * d.Dqk, row_sum.data(),
                      dk_part.data() + ((b * d.H + g * p.group) * d.S + i) * d.Dqk, d.S * d.Dqk, p.group, d.Dqk);
        add_group_sum(dv + (bs * d.Hkv + g) * d.Dv, row_sum.data(),
                      dv_part.data() + ((b * d.H + g * p.group) * d.S + i) * d.Dv, d.S * d.Dv, p.group, d.Dv);
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, const float*, const float*,
                                       const AttentionDims&);
template void attention_forward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const AttentionDims&);
template void attention_backward<float>(float*, float*, float*, const float*, const float*, const float*,
                                        const float*, const float*, const float*, const AttentionDims&);
template void attention_backward<bf16>(bf16*, bf16*, bf16*, const float*, const bf16*, const bf16*, const bf16*,
                                       const bf16*, const bf16*, const AttentionDims&);

}  // namespace titan::kernels::cpu::TITAN_ISA
