// The elementwise and data-movement stages of the fast sparse MLA kernels (see cpu/sparse_mla.h);
// the products run in oneDNN. Every stage is one OpenMP loop over independent rows or columns, so
// no stage needs atomics and each is deterministic.
#include "titan/kernels/cpu/sparse_mla.h"

#include <cstring>

#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr float kInf = __builtin_inff();

// Columns of the dkv accumulator one thread owns in the scatter: a 64-byte line of floats.
constexpr int64_t kScatterCols = 16;

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

void sparse_mla_scatter_add(float* acc, const float* drows, const float* bias, const int32_t* idx, int64_t nq,
                            const SparseMlaDims& d) {
  // Threads own column strips of the accumulator and walk every slot in order: two queries that
  // selected the same key never race, and the summation order is fixed.
  const int64_t strips = (d.Dqk + kScatterCols - 1) / kScatterCols;
#pragma omp parallel for schedule(static)
  for (int64_t strip = 0; strip < strips; ++strip) {
    const int64_t c0 = strip * kScatterCols, c1 = c0 + kScatterCols < d.Dqk ? c0 + kScatterCols : d.Dqk;
    for (int64_t j = 0; j < nq * d.K; ++j) {
      if (bias[j] != 0.0f) continue;  // invalid slot
      float* dst = acc + int64_t(idx[j]) * d.Dqk;
      const float* src = drows + j * d.Dqk;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

template <class T>
void sparse_mla_store(T* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t e = 0; e < n; ++e) dst[e] = from_f32<T>(src[e]);
}

#define TITAN_INSTANTIATE(T)                                                                                       \
  template void sparse_mla_gather<T>(T*, float*, const T*, const int32_t*, int64_t, int64_t, const SparseMlaDims&); \
  template void sparse_mla_softmax<T>(T*, float*, const float*, const float*, int64_t, const SparseMlaDims&);        \
  template void sparse_mla_softmax_grad<T>(T*, T*, const float*, const float*, const float*, const float*, const T*, \
                                           const T*, int64_t, const SparseMlaDims&);                                 \
  template void sparse_mla_store<T>(T*, const float*, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
