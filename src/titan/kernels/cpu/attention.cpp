// Flash attention on the CPU, FlashAttention-2 blocking: a block of kBlock query rows stays
// resident while key/value blocks stream past, and scores only ever exist as kBlock x kBlock
// tiles. Every product is a register-tiled f32 micro-kernel over packed, zero-padded buffers.
// bf16 inputs are widened to f32 once, while packing (O(S D) work against O(S^2 D) products):
// on the Xeon this was tuned on, VDPBF16PS runs at half the f32 FMA rate, so f32 FMA is the
// faster way to multiply bf16 there.
#include "titan/kernels/cpu/attention.h"

#include <omp.h>

#include "titan/core/allocator.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Query rows and key columns per tile: a 64 x 64 f32 score tile is 16 KiB and stays in L1 next to
// the key block it came from.
constexpr int64_t kBlock = 64;
constexpr int64_t kLanes = 16;  // floats per vec16; packed widths are padded to a multiple of it

// 16 floats as one GCC vector: one zmm with AVX-512, two ymm with AVX2, four xmm on the baseline.
// The compiler contracts `acc += a * b` into FMA where the ISA has one. aligned(4) and may_alias:
// loads from any float address inside our float buffers.
// Functions taking or returning vec16 below are internal and force-inlined, so the warning that
// their ABI differs between ISA levels (they never cross a call boundary) does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vec16 __attribute__((vector_size(64), aligned(4), may_alias));
typedef int32_t vec16i __attribute__((vector_size(64)));

// Register tile: kRows x kVecs vec16 accumulators plus kVecs loaded B vectors and one broadcast
// must fit the register file (32 zmm with AVX-512; 16 ymm / 16 xmm otherwise).
#if defined(__AVX512F__)
constexpr int kRows = 6, kVecs = 4;
#elif defined(__AVX2__)
constexpr int kRows = 4, kVecs = 1;
#else
constexpr int kRows = 2, kVecs = 1;
#endif

TITAN_INLINE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

TITAN_INLINE vec16 splat(float x) { return vec16{} + x; }
TITAN_INLINE vec16 load16(const float* p) { return *reinterpret_cast<const vec16*>(p); }
TITAN_INLINE void store16(float* p, vec16 x) { *reinterpret_cast<vec16*>(p) = x; }
TITAN_INLINE vec16 max16(vec16 a, vec16 b) { return a > b ? a : b; }
TITAN_INLINE float reduce_max(vec16 x) {
  float m = x[0];
  for (int i = 1; i < 16; ++i) m = x[i] > m ? x[i] : m;
  return m;
}
TITAN_INLINE float reduce_add(vec16 x) {
  float s = 0;
  for (int i = 0; i < 16; ++i) s += x[i];
  return s;
}

// fast_exp (cpu/isa.h) on 16 lanes with the same range reduction and polynomial, written on
// vec16 so it vectorizes at every ISA level without relying on the auto-vectorizer. Rounds with
// the 1.5 * 2^23 trick (round to nearest even, exact for |x log2 e| < 2^22). -inf gives 0.
TITAN_INLINE vec16 exp16(vec16 x) {
  x = x < splat(-87.33654f) ? splat(-87.33654f - 1.0f) : x;
  x = x > splat(88.72283f) ? splat(88.72283f) : x;
  const vec16 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  vec16 r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  vec16 p = splat(1.0f / 720);
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  vec16i e = __builtin_convertvector(n, vec16i) + 127;
  e = e < 0 ? 0 : e;
  e = e > 255 ? 255 : e;
  const vec16 scale = (vec16)(e << 23);
  return p * scale;
}
TITAN_INLINE int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Zero-filled f32 scratch from the titan allocator (64-byte aligned; counted as temporaries).
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : bytes_(size_t(n) * sizeof(float)), p_(static_cast<float*>(memory_alloc(bytes_, MemCategory::temporaries))) {
    std::memset(p_, 0, bytes_);
  }
  ~Scratch() { memory_free(p_, bytes_, MemCategory::temporaries); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return p_; }

 private:
  size_t bytes_;
  float* p_;
};

// ---- micro-kernel ---------------------------------------------------------------------------
// c[r][0, 16 Vecs) (+)= sum_k a(r, k) b[k][0, 16 Vecs) for r < Rows, with a(r, k) =
// a[r * a_row + k * a_k] (so A may be read transposed: P^T, dS^T) and b rows ldb floats apart.
// Accumulators live in registers for the whole k loop.
template <int Rows, int Vecs, bool kAccumulate>
TITAN_INLINE void gemm_tile(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b,
                            int64_t ldb, int64_t K) {
  vec16 acc[Rows][Vecs];
#pragma GCC unroll 8
  for (int r = 0; r < Rows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      if constexpr (kAccumulate) {
        acc[r][v] = *reinterpret_cast<const vec16*>(c + r * ldc + v * kLanes);
      } else {
        acc[r][v] = vec16{};
      }
    }
  }
  for (int64_t kk = 0; kk < K; ++kk) {
    vec16 bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) bv[v] = *reinterpret_cast<const vec16*>(b + kk * ldb + v * kLanes);
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
    for (int v = 0; v < Vecs; ++v) *reinterpret_cast<vec16*>(c + r * ldc + v * kLanes) = acc[r][v];
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
// every B operand and C tile is a packed buffer padded to that width. The B strip (K x 64 floats)
// stays in L1 while the row tiles run over it.
template <bool kAccumulate>
void gemm(float* c, int64_t ldc, const float* a, int64_t a_row, int64_t a_k, const float* b, int64_t ldb, int64_t M,
          int64_t N, int64_t K) {
  for (int64_t n = 0; n < N; n += kVecs * kLanes) {
    const int64_t vecs = min_i64((N - n) / kLanes, kVecs);
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

// dst[c][j] = src row (row0 + j), column c, for the rows of one block (zero past S): the
// transposed, vector-friendly B operand of q k^T and dO v^T. dst [width, kBlock].
template <class T>
void pack_block_transposed(float* dst, const T* src, int64_t ld, int64_t row0, int64_t S, int64_t width) {
  const int64_t rows = min_i64(kBlock, S - row0);
  for (int64_t j = 0; j < rows; ++j) {
    const T* row = src + (row0 + j) * ld;
    for (int64_t c = 0; c < width; ++c) dst[c * kBlock + j] = to_f32(row[c]);
  }
}

// dst[j][c] = scale * src row j, column c, rows [row0, row0 + rows); dst rows are ld_dst floats
// apart and columns past width keep their zeros.
template <class T>
void pack_rows(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t width, float scale) {
  for (int64_t j = 0; j < rows; ++j) {
    const T* row = src + j * ld_src;
    float* out = dst + j * ld_dst;
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) out[c] = scale * to_f32(row[c]);
  }
}

// Keys and values of every (b, kv head), packed once and shared by all query heads of the group:
// kt [B, Hkv, nblk, Dqk, kBlock] (transposed blocks), vp [B, Hkv, s_pad, dv_pad] (rows). The
// backward also needs kp [B, Hkv, s_pad, dqk_pad] (rows, for dS k) and vt (transposed, for dO v^T).
template <class T>
void pack_kv(float* kt, float* kp, float* vp, float* vt, const T* k, const T* v, const AttentionDims& d,
             const Plan& p) {
  const int64_t items = d.B * d.Hkv * p.nblk;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < items; ++t) {
    const int64_t blk = t % p.nblk, bg = t / p.nblk, b = bg / d.Hkv, g = bg % d.Hkv;
    const int64_t row0 = blk * kBlock, rows = min_i64(kBlock, d.S - row0);
    const T* kh = k + (b * d.S * d.Hkv + g) * d.Dqk;  // row s at kh + s * Hkv * Dqk
    const T* vh = v + (b * d.S * d.Hkv + g) * d.Dv;
    if (kt) pack_block_transposed(kt + (bg * p.nblk + blk) * d.Dqk * kBlock, kh, d.Hkv * d.Dqk, row0, d.S, d.Dqk);
    if (vt) pack_block_transposed(vt + (bg * p.nblk + blk) * d.Dv * kBlock, vh, d.Hkv * d.Dv, row0, d.S, d.Dv);
    if (kp) {
      pack_rows(kp + (bg * p.s_pad + row0) * p.dqk_pad, p.dqk_pad, kh + row0 * d.Hkv * d.Dqk, d.Hkv * d.Dqk, rows,
                d.Dqk, 1.0f);
    }
    if (vp) {
      pack_rows(vp + (bg * p.s_pad + row0) * p.dv_pad, p.dv_pad, vh + row0 * d.Hkv * d.Dv, d.Hkv * d.Dv, rows, d.Dv,
                1.0f);
    }
  }
}

// Causal mask of a diagonal tile: scores above the diagonal become -inf (exp gives 0).
void mask_upper(float* s, int64_t rows) {  // s [kBlock, kBlock]
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = r + 1; j < kBlock; ++j) s[r * kBlock + j] = -INFINITY;
  }
}

}  // namespace

// ---- forward ----------------------------------------------------------------------------------
template <class T>
void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v, const AttentionDims& d) {
  const Plan p = make_plan(d);
  Scratch kt(d.B * d.Hkv * p.nblk * d.Dqk * kBlock);  // [B, Hkv, nblk, Dqk, kBlock]
  Scratch vp(d.B * d.Hkv * p.s_pad * p.dv_pad);        // [B, Hkv, s_pad, dv_pad]
  pack_kv<T>(kt.get(), nullptr, vp.get(), nullptr, k, v, d, p);

  const float scale = float(d.scale);
  const int64_t heads = d.B * d.H, items = heads * p.nblk;
#pragma omp parallel
  {
    Scratch qs(kBlock * d.Dqk);        // [kBlock, Dqk] scale * q of the resident block
    Scratch s(kBlock * kBlock);        // [kBlock, kBlock] scores, then probabilities
    Scratch oacc(kBlock * p.dv_pad);   // [kBlock, dv_pad] unnormalized output
    Scratch m(kBlock), l(kBlock);      // [kBlock] running row max and row sum
    // Causal work grows with the query block index: hand out the largest blocks first so the
    // dynamic schedule ends with small items and threads finish together.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < items; ++t) {
      const int64_t qb = p.nblk - 1 - t / heads, bh = t % heads, b = bh / d.H, h = bh % d.H;
      const int64_t bg = b * d.Hkv + h / p.group;
      const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
      pack_rows(qs.get(), d.Dqk, q + ((b * d.S + row0) * d.H + h) * d.Dqk, d.H * d.Dqk, rows, d.Dqk, scale);
      for (int64_t r = 0; r < rows; ++r) m.get()[r] = -INFINITY, l.get()[r] = 0;
      std::memset(oacc.get(), 0, size_t(rows * p.dv_pad) * sizeof(float));

      for (int64_t kb = 0; kb <= qb; ++kb) {
        const bool diagonal = kb == qb;
        gemm<false>(s.get(), kBlock, qs.get(), d.Dqk, 1, kt.get() + (bg * p.nblk + kb) * d.Dqk * kBlock, kBlock, rows,
                    kBlock, d.Dqk);
        // Online softmax: rescale what was accumulated under the old row max. On the diagonal
        // block row r sees columns <= r, which also hides the zero padding past S.
        if (diagonal) mask_upper(s.get(), rows);
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = s.get() + r * kBlock;
          vec16 mx = load16(sr);
          for (int64_t j = kLanes; j < kBlock; j += kLanes) mx = max16(mx, load16(sr + j));
          const float m_old = m.get()[r], row_max = reduce_max(mx), m_new = row_max > m_old ? row_max : m_old;
          const float alpha = fast_exp(m_old - m_new);
          // Scalar math: p_j = exp(s_j - m_new); l = l * alpha + sum_j p_j
          vec16 sum = vec16{};
          for (int64_t j = 0; j < kBlock; j += kLanes) {
            const vec16 pj = exp16(load16(sr + j) - m_new);
            store16(sr + j, pj);
            sum += pj;
          }
          l.get()[r] = l.get()[r] * alpha + reduce_add(sum);
          m.get()[r] = m_new;
          if (alpha != 1.0f) {
            float* orow = oacc.get() + r * p.dv_pad;
            for (int64_t c = 0; c < p.dv_pad; c += kLanes) store16(orow + c, load16(orow + c) * alpha);
          }
        }
        // o += P v; on the diagonal block probabilities past column rows - 1 are zero.
        gemm<true>(oacc.get(), p.dv_pad, s.get(), kBlock, 1, vp.get() + (bg * p.s_pad + kb * kBlock) * p.dv_pad,
                   p.dv_pad, rows, p.dv_pad, diagonal ? rows : kBlock);
      }

      for (int64_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / l.get()[r];
        const float* orow = oacc.get() + r * p.dv_pad;
        T* out = o + ((b * d.S + row0 + r) * d.H + h) * d.Dv;
#pragma omp simd
        for (int64_t c = 0; c < d.Dv; ++c) out[c] = from_f32<T>(orow[c] * inv);
        lse[bh * d.S + row0 + r] = m.get()[r] + std::log(l.get()[r]);
      }
    }
  }
}

// ---- backward ---------------------------------------------------------------------------------
// One work item per (b, query head): key blocks outer, query blocks (>= the key block) inner, so
// dk and dv of a key block are finished in registers/L1 before moving on, and dq of the whole
// head accumulates in a per-item f32 buffer. No two items write the same memory: dk and dv go to
// per-head f32 partials, summed over each GQA group in head order afterwards. Every sum therefore
// runs in a fixed order and the result does not depend on scheduling.
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const float* lse, const T* dout, const T* q, const T* k, const T* v,
                        const T* o, const AttentionDims& d) {
  const Plan p = make_plan(d);
  Scratch kt(d.B * d.Hkv * p.nblk * d.Dqk * kBlock);  // [B, Hkv, nblk, Dqk, kBlock]
  Scratch vt(d.B * d.Hkv * p.nblk * d.Dv * kBlock);   // [B, Hkv, nblk, Dv, kBlock]
  Scratch kp(d.B * d.Hkv * p.s_pad * p.dqk_pad);      // [B, Hkv, s_pad, dqk_pad]
  pack_kv<T>(kt.get(), kp.get(), nullptr, vt.get(), k, v, d, p);
  Scratch dk_part(d.B * d.H * d.S * d.Dqk);  // [B, H, S, Dqk] this head's share of dk
  Scratch dv_part(d.B * d.H * d.S * d.Dv);   // [B, H, S, Dv]

  const float scale = float(d.scale);
  const int64_t heads = d.B * d.H;
#pragma omp parallel
  {
    Scratch qs(p.s_pad * p.dqk_pad);       // [s_pad, dqk_pad] scale * q of this head
    Scratch dos(p.s_pad * p.dv_pad);       // [s_pad, dv_pad] dO of this head
    Scratch dq_acc(p.s_pad * p.dqk_pad);   // [s_pad, dqk_pad] dq / scale
    Scratch delta(p.s_pad);                // [s_pad] D_i = rowsum(dO * O)
    Scratch s(kBlock * kBlock);            // [kBlock, kBlock] P
    Scratch ds(kBlock * kBlock);           // [kBlock, kBlock] dP, then dS
    Scratch dk_acc(kBlock * p.dqk_pad);    // [kBlock, dqk_pad]
    Scratch dv_acc(kBlock * p.dv_pad);     // [kBlock, dv_pad]
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H, bg = b * d.Hkv + h / p.group;
      const float* lse_h = lse + bh * d.S;  // [S]
      pack_rows(qs.get(), p.dqk_pad, q + (b * d.S * d.H + h) * d.Dqk, d.H * d.Dqk, d.S, d.Dqk, scale);
      pack_rows(dos.get(), p.dv_pad, dout + (b * d.S * d.H + h) * d.Dv, d.H * d.Dv, d.S, d.Dv, 1.0f);
      for (int64_t i = 0; i < d.S; ++i) {
        const T* orow = o + ((b * d.S + i) * d.H + h) * d.Dv;
        const float* dorow = dos.get() + i * p.dv_pad;
        float sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < d.Dv; ++c) sum += dorow[c] * to_f32(orow[c]);
        delta.get()[i] = sum;
      }
      std::memset(dq_acc.get(), 0, size_t(p.s_pad * p.dqk_pad) * sizeof(float));

      for (int64_t kb = 0; kb < p.nblk; ++kb) {
        const int64_t col0 = kb * kBlock, cols = min_i64(kBlock, d.S - col0);
        const float* kt_blk = kt.get() + (bg * p.nblk + kb) * d.Dqk * kBlock;  // [Dqk, kBlock]
        const float* vt_blk = vt.get() + (bg * p.nblk + kb) * d.Dv * kBlock;   // [Dv, kBlock]
        const float* kp_blk = kp.get() + (bg * p.s_pad + col0) * p.dqk_pad;    // [kBlock, dqk_pad]
        std::memset(dk_acc.get(), 0, size_t(kBlock * p.dqk_pad) * sizeof(float));
        std::memset(dv_acc.get(), 0, size_t(kBlock * p.dv_pad) * sizeof(float));
        for (int64_t qb = kb; qb < p.nblk; ++qb) {
          const bool diagonal = qb == kb;
          const int64_t row0 = qb * kBlock, rows = min_i64(kBlock, d.S - row0);
          const float* qs_blk = qs.get() + row0 * p.dqk_pad;   // [kBlock, dqk_pad]
          const float* dos_blk = dos.get() + row0 * p.dv_pad;  // [kBlock, dv_pad]
          gemm<false>(s.get(), kBlock, qs_blk, p.dqk_pad, 1, kt_blk, kBlock, rows, kBlock, d.Dqk);
          // Scalar math: P = exp(scale q.k - lse) where causal (j <= i), else 0. On the diagonal
          // block the mask also hides the key padding past S.
          if (diagonal) mask_upper(s.get(), rows);
          for (int64_t r = 0; r < rows; ++r) {
            float* sr = s.get() + r * kBlock;
            const float lse_i = lse_h[row0 + r];
            for (int64_t j = 0; j < kBlock; j += kLanes) store16(sr + j, exp16(load16(sr + j) - lse_i));
          }
          // dv += P^T dO
          gemm<true>(dv_acc.get(), p.dv_pad, s.get(), 1, kBlock, dos_blk, p.dv_pad, cols, p.dv_pad, rows);
          // dP = dO v^T, then dS = P (dP - D_i)
          gemm<false>(ds.get(), kBlock, dos_blk, p.dv_pad, 1, vt_blk, kBlock, rows, kBlock, d.Dv);
          for (int64_t r = 0; r < rows; ++r) {
            float* dsr = ds.get() + r * kBlock;
            const float* pr = s.get() + r * kBlock;
            const float delta_i = delta.get()[row0 + r];
            for (int64_t j = 0; j < kBlock; j += kLanes) {
              store16(dsr + j, load16(pr + j) * (load16(dsr + j) - delta_i));
            }
          }
          // dk += scale dS^T q (qs carries the scale); dq += dS k (scaled once at the end)
          gemm<true>(dk_acc.get(), p.dqk_pad, ds.get(), 1, kBlock, qs_blk, p.dqk_pad, cols, p.dqk_pad, rows);
          gemm<true>(dq_acc.get() + row0 * p.dqk_pad, p.dqk_pad, ds.get(), kBlock, 1, kp_blk, p.dqk_pad, rows,
                     p.dqk_pad, cols);
        }
        for (int64_t j = 0; j < cols; ++j) {
          std::memcpy(dk_part.get() + (bh * d.S + col0 + j) * d.Dqk, dk_acc.get() + j * p.dqk_pad,
                      size_t(d.Dqk) * sizeof(float));
          std::memcpy(dv_part.get() + (bh * d.S + col0 + j) * d.Dv, dv_acc.get() + j * p.dv_pad,
                      size_t(d.Dv) * sizeof(float));
        }
      }
      for (int64_t i = 0; i < d.S; ++i) {
        T* out = dq + ((b * d.S + i) * d.H + h) * d.Dqk;
        const float* acc = dq_acc.get() + i * p.dqk_pad;
#pragma omp simd
        for (int64_t c = 0; c < d.Dqk; ++c) out[c] = from_f32<T>(to_f32(out[c]) + scale * acc[c]);
      }
    }

    // dk, dv += sum over the group's heads of their partials, in head order.
#pragma omp for schedule(static)
    for (int64_t bs = 0; bs < d.B * d.S; ++bs) {
      const int64_t b = bs / d.S, i = bs % d.S;
      for (int64_t g = 0; g < d.Hkv; ++g) {
        T* dk_row = dk + (bs * d.Hkv + g) * d.Dqk;
        T* dv_row = dv + (bs * d.Hkv + g) * d.Dv;
        for (int64_t c = 0; c < d.Dqk; ++c) {
          float sum = 0;
          for (int64_t h = g * p.group; h < (g + 1) * p.group; ++h) sum += dk_part.get()[((b * d.H + h) * d.S + i) * d.Dqk + c];
          dk_row[c] = from_f32<T>(to_f32(dk_row[c]) + sum);
        }
        for (int64_t c = 0; c < d.Dv; ++c) {
          float sum = 0;
          for (int64_t h = g * p.group; h < (g + 1) * p.group; ++h) sum += dv_part.get()[((b * d.H + h) * d.S + i) * d.Dv + c];
          dv_row[c] = from_f32<T>(to_f32(dv_row[c]) + sum);
        }
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
