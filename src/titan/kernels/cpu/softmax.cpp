#include "titan/kernels/cpu/softmax.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/chunks.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

// One row is read from memory once (for its max, or its dot product in backward); the later
// passes find it in L1/L2 (a row of up to ~512 KiB, e.g. a 129K-entry vocabulary in f32, still
// fits in L2). The cache passes run in chunks (cpu/chunks.h) that prefetch the next row, so
// memory stays busy meanwhile, round bf16 outputs in bulk, and stream large outputs to memory.
// Rows go to force-inlined row functions so the pointers are plain parameters, which GCC
// vectorizes (captured by a lambda, they may not be).
namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Rows per thread chunk: enough that a chunk holds ~32K elements.
TITAN_INLINE int64_t row_grain(int64_t D) { return D >= (1 << 15) ? 1 : (1 << 15) / D; }

// e: [D] scratch that holds exp(x - max) between the sum and the scaling, so exp runs once per
// element (it is most of the arithmetic) and bf16 outputs are rounded once. next: the next row's
// offset from this one (0: none), prefetched during the exp pass, the costly one. streaming:
// write y with streaming stores (cpu/chunks.h).
template <class T>
TITAN_INLINE void softmax_forward_row(T* y, float* e, const T* x, int64_t D, int64_t next, bool streaming) {
  float m = to_f32(x[0]);
  // Scalar math: m = max_j x_j
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < D; ++j) {
    const float v = to_f32(x[j]);
    m = v > m ? v : m;
  }
  float s = 0;
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    // Scalar math: e_j = exp(x_j - m); s = sum_j e_j
#pragma omp simd reduction(+ : s)
    for (int64_t j = j0; j < j1; ++j) {
      const float v = fast_exp(to_f32(x[j]) - m);
      e[j] = v;
      s += v;
    }
  }
  const float inv = 1.0f / s;
  ChunkOut<T> out(streaming);
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    float* o = out.at(y, j0);
    // Scalar math: y_j = e_j / s
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) o[j - j0] = e[j] * inv;
    out.flush(y, j0, j1);
  }
}

#if defined(TITAN_AVX512_ROWS)
// The same three passes with AVX-512 (cpu/avx512.h): max; e = 2^(x log2e - m log2e) with its
// sum; y = e / s, rounded and stored 16 lanes at a time (streaming: through an L1 chunk).
template <class T>
TITAN_INLINE void softmax_forward_row_avx512(T* y, float* e, const T* x, int64_t D, int64_t next, bool streaming) {
  constexpr float kLog2e = 1.44269504088896341f;
  const float m = max_span(x, D);
  int64_t j = 0;
  const __m512 log2e = _mm512_set1_ps(kLog2e), m_log2e = _mm512_set1_ps(m * kLog2e);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    // Scalar math: e_j = exp(x_j - m); s = sum_j e_j
    for (j = j0; j + 32 <= j1; j += 32) {
      const __m512 a = exp2_16(_mm512_fmsub_ps(load16(x + j), log2e, m_log2e));
      const __m512 b = exp2_16(_mm512_fmsub_ps(load16(x + j + 16), log2e, m_log2e));
      _mm512_storeu_ps(e + j, a);
      _mm512_storeu_ps(e + j + 16, b);
      s0 = _mm512_add_ps(s0, a);
      s1 = _mm512_add_ps(s1, b);
    }
    for (; j < j1; j += 16) {
      const __mmask16 k = lanes(j1 - j);
      const __m512 a = exp2_16(_mm512_fmsub_ps(load16(x + j, k), log2e, m_log2e));
      _mm512_mask_storeu_ps(e + j, k, a);
      s0 = _mm512_mask_add_ps(s0, k, s0, a);
    }
  }
  const __m512 inv = _mm512_set1_ps(1.0f / hsum16(_mm512_add_ps(s0, s1)));
  // Scalar math: y_j = e_j / s
  if (!streaming) {
    for (j = 0; j + 16 <= D; j += 16) store16(y + j, _mm512_mul_ps(load16(e + j), inv));
    if (j < D) store16(y + j, _mm512_mul_ps(load16(e + j, lanes(D - j)), inv), lanes(D - j));
    return;
  }
  alignas(64) T chunk[kChunk];
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    for (j = j0; j + 16 <= j1; j += 16) store16(chunk + (j - j0), _mm512_mul_ps(load16(e + j), inv));
    if (j < j1) store16(chunk + (j - j0), _mm512_mul_ps(load16(e + j, lanes(j1 - j)), inv));  // chunk has room
    stream_bytes(y + j0, chunk, (j1 - j0) * int64_t(sizeof(T)));
  }
}
#endif

// next: the next row's offset from this one (0: none), prefetched during the last pass.
template <class T>
TITAN_INLINE void softmax_backward_row(T* dx, const T* dy, const T* y, int64_t D, int64_t next) {
  float dot = 0;
  // Scalar math: dot = sum_j dy_j * y_j
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < D; ++j) dot += to_f32(dy[j]) * to_f32(y[j]);
  ChunkOut<T> out;
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? dy + next : nullptr, j0, j1);
    prefetch_to_l2(next ? y + next : nullptr, j0, j1);
    prefetch_to_l2(next ? dx + next : nullptr, j0, j1);
    float* o = out.at(dx, j0);
    // Scalar math: dx_j += y_j * (dy_j - dot)
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) o[j - j0] = to_f32(dx[j]) + to_f32(y[j]) * (to_f32(dy[j]) - dot);
    out.flush(dx, j0, j1);
  }
}
}  // namespace

template <class T>
void softmax_forward(T* y, const T* x, int64_t N, int64_t D) {
  const bool streaming = N * D * int64_t(sizeof(T)) >= kStreamingBytes;
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    Scratch<float> e(D);  // [D]
    for (int64_t i = lo; i < hi; ++i) {
#if defined(TITAN_AVX512_ROWS)
      softmax_forward_row_avx512(y + i * D, e.data(), x + i * D, D, i + 1 < hi ? D : 0, streaming);
#else
      softmax_forward_row(y + i * D, e.data(), x + i * D, D, i + 1 < hi ? D : 0, streaming);
#endif
    }
    if (streaming) streaming_done();
  });
}

template <class T>
void softmax_backward(T* dx, const T* dy, const T* y, int64_t N, int64_t D) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) softmax_backward_row(dx + i * D, dy + i * D, y + i * D, D, i + 1 < hi ? D : 0);
  });
}

#define TITAN_INSTANTIATE(T)                                                   \
  template void softmax_forward<T>(T*, const T*, int64_t, int64_t);            \
  template void softmax_backward<T>(T*, const T*, const T*, int64_t, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
