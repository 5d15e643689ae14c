// The elementwise, data-movement and dkv stages of the fast sparse MLA kernels (see
// cpu/sparse_mla.h); the other products run in oneDNN. Every stage is one OpenMP loop over
// independent rows, or (dkv) over queries into per-thread accumulators, so none needs atomics.
#include "titan/kernels/cpu/sparse_mla.h"

#include <omp.h>

#include <cstring>

#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr float kInf = __builtin_inff();

// Accumulator rows are padded to a multiple of 16 floats: whole vectors at every ISA level.
constexpr int64_t kLanes = 16;

// One native vector of floats as a GCC vector type (16 lanes with AVX-512, 8 with AVX2, 4 on the
// baseline); `acc += a * b` contracts into FMA where the ISA has one. Register tile of the dkv
// product: kRows x kVecs accumulators, kVecs B vectors and a broadcast fit the register file.
// aligned(4): accumulator rows are only 64-byte aligned when the row width allows.
#if defined(__AVX512F__)
constexpr int64_t kVecLanes = 16;
constexpr int kRows = 6, kVecs = 4;
#elif defined(__AVX2__)
constexpr int64_t kVecLanes = 8;
constexpr int kRows = 6, kVecs = 2;
#else
constexpr int64_t kVecLanes = 4;
constexpr int kRows = 4, kVecs = 2;
#endif
// vecf never crosses a call boundary (everything taking it is force-inlined), so the warning that
// its ABI differs between ISA levels does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vecf __attribute__((vector_size(sizeof(float) * kVecLanes), aligned(4), may_alias));

// c[r][col, col + Vecs * kVecLanes) += sum_k a[r * inner + k] b[k * ldb + (0, Vecs * kVecLanes)]
// for r < kRows: the sums stay in registers over the whole inner loop and touch each (scattered)
// accumulator row once.
template <int Vecs>
TITAN_INLINE void scatter_tile(float* const* c, int64_t col, const float* a, const float* b, int64_t ldb,
                               int64_t inner) {
  vecf acc[kRows][Vecs];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) acc[r][v] = vecf{};
  }
  for (int64_t k = 0; k < inner; ++k) {
    vecf bv[Vecs];
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) bv[v] = *reinterpret_cast<const vecf*>(b + k * ldb + v * kVecLanes);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const float ar = a[r * inner + k];
#pragma GCC unroll 4
      for (int v = 0; v < Vecs; ++v) acc[r][v] += ar * bv[v];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < Vecs; ++v) {
      vecf* dst = reinterpret_cast<vecf*>(c[r] + col + v * kVecLanes);
      *dst = *dst + acc[r][v];
    }
  }
}

// The last column strip may hold fewer than kVecs vectors.
template <int Vecs>
TITAN_INLINE void scatter_tile_tail(int64_t vecs, float* const* c, int64_t col, const float* a, const float* b,
                                    int64_t ldb, int64_t inner) {
  if (vecs == Vecs) {
    scatter_tile<Vecs>(c, col, a, b, ldb, inner);
  } else if constexpr (Vecs > 1) {
    scatter_tile_tail<Vecs - 1>(vecs, c, col, a, b, ldb, inner);
  }
}

}  // namespace

template <class T>
void sparse_mla_gather(T* rows, float* bias, const T* kv, const int32_t* idx, int64_t t0, int64_t nq,
                       const SparseMlaDims& d) {
  const int64_t slots = nq * d.K, row_bytes = d.Dqk * int64_t(sizeof(T));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < slots; ++j) {
    const int64_t t = t0 + j / d.K;
    const int32_t s = idx[j];
    // Invalid slots get a zero row, so the GEMMs read finite values, and a -inf bias.
    const bool valid = s >= 0 && int64_t(s) <= t + (d.Skv - d.S);
    if (valid) {
      std::memcpy(rows + j * d.Dqk, kv + int64_t(s) * d.Dqk, size_t(row_bytes));
    } else {
      std::memset(static_cast<void*>(rows + j * d.Dqk), 0, size_t(row_bytes));
    }
    bias[j] = valid ? 0.0f : -kInf;
  }
}

template <class T>
void sparse_mla_softmax(T* p, float* lse, const float* scores, const float* bias, int64_t nq,
                        const SparseMlaDims& d) {
  const int64_t K = d.K;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nq * d.H; ++r) {
    const float* s = scores + r * K;
    const float* b = bias + (r / d.H) * K;
    T* pr = p + r * K;
    float m = -kInf;
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < K; ++i) m = s[i] + b[i] > m ? s[i] + b[i] : m;
    if (m == -kInf) {  // no valid slot: o = 0 through P = 0, lse = +inf (FlashMLA's convention)
      for (int64_t i = 0; i < K; ++i) pr[i] = from_f32<T>(0.0f);
      lse[r] = kInf;
      continue;
    }
    float l = 0;
#pragma omp simd reduction(+ : l)
    for (int64_t i = 0; i < K; ++i) l += fast_exp(s[i] + b[i] - m);
    const float row_lse = m + __builtin_logf(l);  // the libm call, not a wrapper shared across ISA variants
    lse[r] = row_lse;
    // P normalized here, so the output GEMM writes o directly (no rescaling pass).
#pragma omp simd
    for (int64_t i = 0; i < K; ++i) pr[i] = from_f32<T>(fast_exp(s[i] + b[i] - row_lse));
  }
}

template <class T>
void sparse_mla_softmax_grad(T* p, T* ds, const float* scores, const float* da, const float* bias, const float* lse,
                             const T* dout, const T* o, int64_t nq, const SparseMlaDims& d) {
  const int64_t K = d.K;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < nq * d.H; ++r) {
    const T* dor = dout + r * d.Dv;
    const T* orow = o + r * d.Dv;
    float delta = 0;  // rowsum(dO * O) = sum_i P_i dA_i
#pragma omp simd reduction(+ : delta)
    for (int64_t c = 0; c < d.Dv; ++c) delta += to_f32(dor[c]) * to_f32(orow[c]);
    const float* s = scores + r * K;
    const float* dar = da + r * K;
    const float* b = bias + (r / d.H) * K;
    // An empty row has lse = +inf: every P is exp(-inf) = 0, so it sends no gradient anywhere.
    const float row_lse = lse[r];
    T* pr = p + r * K;
    T* dsr = ds + r * K;
#pragma omp simd
    for (int64_t i = 0; i < K; ++i) {
      const float pi = fast_exp(s[i] + b[i] - row_lse);
      pr[i] = from_f32<T>(pi);
      dsr[i] = from_f32<T>(pi * (dar[i] - delta));
    }
  }
}

int64_t sparse_mla_acc_width(int64_t dqk) { return (dqk + kLanes - 1) / kLanes * kLanes; }

template <class T>
void sparse_mla_dkv_accumulate(float* acc, int64_t parts, const T* p, const T* ds, const T* q, const T* dout,
                               const float* bias, const int32_t* idx, int64_t nq, const SparseMlaDims& d) {
  // Per query, the dkv rows of its valid slots are one product with inner dimension 2H:
  //   [n, 2H] x [2H, Dqk]  with  A[r] = (scale * dS[:, i_r], P[:, i_r])  and  B = (Q ; dO padded to Dqk),
  // so the key role (all Dqk dims) and the value role (first Dv) come out of one register tile,
  // which is added straight into the selected rows of this thread's accumulator (no [K, Dqk]
  // intermediate). Threads own whole accumulators, so slots of different queries that select
  // the same key never race.
  const int64_t width = sparse_mla_acc_width(d.Dqk), inner = 2 * d.H;
  const int64_t rows_cap = (d.K + kRows - 1) / kRows * kRows;
  const float scale = float(d.scale);
#pragma omp parallel num_threads(int(parts))
  {
    float* mine = acc + int64_t(omp_get_thread_num()) * d.Skv * width;
    Scratch<float> a(rows_cap * inner);            // [rows_cap, 2H] A, zero rows past the valid slots
    Scratch<float> b(inner * width);               // [2H, width] B
    Scratch<float> dummy(width, ScratchInit::zeroed);  // C row of the padding rows, never read
    Scratch<float*> c(rows_cap);                   // [rows_cap] accumulator row of each A row
#pragma omp for schedule(dynamic, 1)
    for (int64_t qi = 0; qi < nq; ++qi) {
      const float* bq = bias + qi * d.K;
      const int32_t* sel = idx + qi * d.K;
      const T* pq = p + qi * d.H * d.K;
      const T* dsq = ds + qi * d.H * d.K;
      int64_t n = 0;
      for (int64_t i = 0; i < d.K; ++i) {
        if (bq[i] != 0.0f) continue;  // invalid slot
        float* ar = a.data() + n * inner;
        for (int64_t h = 0; h < d.H; ++h) {
          ar[h] = scale * to_f32(dsq[h * d.K + i]);
          ar[d.H + h] = to_f32(pq[h * d.K + i]);
        }
        c.data()[n++] = mine + int64_t(sel[i]) * width;
      }
      if (n == 0) continue;
      const int64_t n_pad = (n + kRows - 1) / kRows * kRows;
      for (int64_t r = n; r < n_pad; ++r) {
        for (int64_t j = 0; j < inner; ++j) a.data()[r * inner + j] = 0.0f;
        c.data()[r] = dummy.data();
      }
      const T* qq = q + qi * d.H * d.Dqk;
      const T* doq = dout + qi * d.H * d.Dv;
      for (int64_t h = 0; h < d.H; ++h) {
        float* bk = b.data() + h * width;
        float* bv = b.data() + (d.H + h) * width;
        for (int64_t col = 0; col < width; ++col) {
          bk[col] = col < d.Dqk ? to_f32(qq[h * d.Dqk + col]) : 0.0f;
          bv[col] = col < d.Dv ? to_f32(doq[h * d.Dv + col]) : 0.0f;
        }
      }
      // Column strips outermost: the strip of B (2H x kVecs vectors) stays in L1 over all rows.
      for (int64_t col = 0; col < width; col += kVecs * kVecLanes) {
        const int64_t vecs = (width - col) / kVecLanes < kVecs ? (width - col) / kVecLanes : kVecs;
        for (int64_t r = 0; r < n_pad; r += kRows) {
          scatter_tile_tail<kVecs>(vecs, c.data() + r, col, a.data() + r * inner, b.data() + col, width, inner);
        }
      }
    }
  }
}

template <class T>
void sparse_mla_dkv_reduce(T* dkv, float* acc, int64_t parts, const SparseMlaDims& d) {
  const int64_t width = sparse_mla_acc_width(d.Dqk);
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < d.Skv; ++s) {
    float* first = acc + s * width;
    for (int64_t part = 1; part < parts; ++part) {
      float* row = acc + (part * d.Skv + s) * width;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) first[c] += row[c], row[c] = 0.0f;
    }
    // Parts are left zeroed for the next batch element.
#pragma omp simd
    for (int64_t c = 0; c < d.Dqk; ++c) dkv[s * d.Dqk + c] = from_f32<T>(first[c]);
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) first[c] = 0.0f;
  }
}

#define TITAN_INSTANTIATE(T)                                                                                       \
  template void sparse_mla_gather<T>(T*, float*, const T*, const int32_t*, int64_t, int64_t, const SparseMlaDims&); \
  template void sparse_mla_softmax<T>(T*, float*, const float*, const float*, int64_t, const SparseMlaDims&);        \
  template void sparse_mla_softmax_grad<T>(T*, T*, const float*, const float*, const float*, const float*, const T*, \
                                           const T*, int64_t, const SparseMlaDims&);                                 \
  template void sparse_mla_dkv_accumulate<T>(float*, int64_t, const T*, const T*, const T*, const T*, const float*,   \
                                             const int32_t*, int64_t, const SparseMlaDims&);                        \
  template void sparse_mla_dkv_reduce<T>(T*, float*, int64_t, const SparseMlaDims&);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
