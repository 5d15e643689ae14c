#include "titan/kernels/cpu/softmax.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/chunks.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

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
    for (int64_t i = lo; i < hi; ++i)
      softmax_forward_row(y + i * D, e.data(), x + i * D, D, i + 1 < hi ? D : 0, streaming);
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
