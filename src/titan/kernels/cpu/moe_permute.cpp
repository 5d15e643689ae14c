#include "titan/kernels/cpu/moe_permute.h"

#include <type_traits>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/chunks.h"
#include "titan/kernels/cpu/row_ops.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

// These kernels move rows and do almost no arithmetic, so memory traffic is their whole cost:
//  - rows are processed in chunks of kChunk elements (chunks.h), and while a token's chunk is
//    summed, the same chunk of the next token's k gathered rows is prefetched: the rows sit at
//    scattered places in the sorted buffer, where the hardware prefetchers find nothing to follow.
//    The gathers request one line of the next row per line they read, spreading the requests over
//    the sums: a burst of a chunk's lines per row before each sum left the gathers at ~30 GB/s
//    where memcpy moved ~44 (bf16 unpermute forward 1.3 -> 0.7-1.0 ms at T 4096, D 1024, top-4);
//  - sums run in f32 in an L1 chunk and are rounded to bf16 once per chunk (ChunkOut);
//  - outputs past kStreamingBytes that are only written (the sorted buffer, the combined rows,
//    the scattered gradient) use streaming stores: no read-for-ownership of the lines they write.

namespace {
// Tokens per thread chunk so a chunk moves about 64 KiB of k rows: below that, threads cost more
// than they save.
int64_t token_grain(int64_t k, int64_t d) { return (1 << 14) / (k * d + 1) + 1; }

template <class T>
bool streams(int64_t rows, int64_t d) {
  return rows * d * int64_t(sizeof(T)) >= kStreamingBytes;
}

// The span loops below (n elements from 0) are written with AVX-512 intrinsics (cpu/avx512.h)
// where available: GCC 12 left the bf16 forms of their `omp simd` twins scalar inside these
// kernels' loops.

// Elements of T per cache line: the spans below request one line of `next` (the same span of the
// row the next token reads; null for none) per line of src they read.
template <class T>
inline constexpr int64_t kLineElems = 64 / int64_t(sizeof(T));

// acc = w * src
template <class T>
TITAN_INLINE void scale_span(float* acc, const T* src, float w, int64_t n, const T* next = nullptr) {
#if defined(TITAN_AVX512_ROWS)
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t c = 0; c < n; c += 16) {
    if (next && c % kLineElems<T> == 0) __builtin_prefetch(next + c, 0, 2);
    const __mmask16 m = lanes(n - c);
    _mm512_mask_storeu_ps(acc + c, m, _mm512_mul_ps(wv, load16(src + c, m)));
  }
#else
  prefetch_to_l2(next, 0, n);
  scale_row(acc, src, w, n);
#endif
}

// acc += w * src
template <class T>
TITAN_INLINE void axpy_span(float* acc, const T* src, float w, int64_t n, const T* next = nullptr) {
#if defined(TITAN_AVX512_ROWS)
  const __m512 wv = _mm512_set1_ps(w);
  for (int64_t c = 0; c < n; c += 16) {
    if (next && c % kLineElems<T> == 0) __builtin_prefetch(next + c, 0, 2);
    const __mmask16 m = lanes(n - c);
    _mm512_mask_storeu_ps(acc + c, m, _mm512_fmadd_ps(wv, load16(src + c, m), load16(acc + c, m)));
  }
#else
  prefetch_to_l2(next, 0, n);
  axpy_row(acc, src, w, n);
#endif
}

// grad = w * g and returns dot(g, o): one pass over g
template <class T>
TITAN_INLINE float scale_and_dot(float* grad, const T* g, const T* o, float w, int64_t n) {
#if defined(TITAN_AVX512_ROWS)
  const __m512 wv = _mm512_set1_ps(w);
  __m512 dot = _mm512_setzero_ps();
  for (int64_t c = 0; c < n; c += 16) {
    const __mmask16 m = lanes(n - c);
    const __m512 gc = load16(g + c, m);
    _mm512_mask_storeu_ps(grad + c, m, _mm512_mul_ps(wv, gc));
    dot = _mm512_fmadd_ps(gc, load16(o + c, m), dot);
  }
  // A fixed-order sum of the lanes (GCC 12 warns falsely inside _mm512_reduce_add_ps).
  alignas(64) float part[16];
  _mm512_store_ps(part, dot);
  float sum = 0;
  for (float v : part) sum += v;
  return sum;
#else
  float dot = 0;
  // Scalar math: grad = w * g; dot += g * o
#pragma omp simd reduction(+ : dot)
  for (int64_t c = 0; c < n; ++c) {
    const float gc = to_f32(g[c]);
    grad[c] = w * gc;
    dot += gc * to_f32(o[c]);
  }
  return dot;
#endif
}
}  // namespace

template <class T>
void moe_permute_forward(T* xs, const T* x, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  // The token rows are read in order (the hardware prefetches them); each is copied k times.
  const bool streaming = streams<T>(n * k, d);
  const int64_t row_bytes = d * int64_t(sizeof(T));
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        T* dst = xs + int64_t(pos[t * k + j]) * d;
        if (streaming) {
          stream_bytes(dst, x + t * d, row_bytes);
        } else {
          std::memcpy(dst, x + t * d, size_t(row_bytes));
        }
      }
    }
    if (streaming) streaming_done();
  });
}

template <class T>
void moe_permute_backward(T* dx, const T* dxs, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  // dx accumulates, so its lines are read anyway: plain stores.
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    ChunkOut<T> chunk;
    for (int64_t t = lo; t < hi; ++t) {
      T* row = dx + t * d;
      const int32_t* next_pos = t + 1 < hi ? pos + (t + 1) * k : nullptr;
      for (int64_t j0 = 0; j0 < d; j0 += kChunk) {
        const int64_t j1 = chunk_end(j0, d);
        float* acc = chunk.at(row, j0);
        // acc = dx + sum over j of dxs[pos[t, j]]
        if constexpr (!std::is_same_v<T, float>) scale_span(acc, row + j0, 1.0f, j1 - j0);
        auto next = [&](int64_t j) { return next_pos ? dxs + int64_t(next_pos[j]) * d + j0 : nullptr; };
        for (int64_t j = 0; j < k; ++j) axpy_span(acc, dxs + int64_t(pos[t * k + j]) * d + j0, 1.0f, j1 - j0, next(j));
        chunk.flush(row, j0, j1);
      }
    }
  });
}

template <class T>
void moe_unpermute_forward(T* y, const T* out, const int32_t* pos, const float* w, int64_t n, int64_t k, int64_t d) {
  const bool streaming = streams<T>(n, d);
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    ChunkOut<T> chunk(streaming);
    for (int64_t t = lo; t < hi; ++t) {
      T* row = y + t * d;
      const int32_t* next_pos = t + 1 < hi ? pos + (t + 1) * k : nullptr;
      for (int64_t j0 = 0; j0 < d; j0 += kChunk) {
        const int64_t j1 = chunk_end(j0, d);
        float* acc = chunk.at(row, j0);
        // acc = sum over j of w[t, j] * out[pos[t, j]]
        auto next = [&](int64_t j) { return next_pos ? out + int64_t(next_pos[j]) * d + j0 : nullptr; };
        scale_span(acc, out + int64_t(pos[t * k]) * d + j0, w[t * k], j1 - j0, next(0));
        for (int64_t j = 1; j < k; ++j)
          axpy_span(acc, out + int64_t(pos[t * k + j]) * d + j0, w[t * k + j], j1 - j0, next(j));
        chunk.flush(row, j0, j1);
      }
    }
    if (streaming) streaming_done();
  });
}

template <class T>
void moe_unpermute_backward(T* dout, float* dw, const T* dy, const T* out, const int32_t* pos, const float* w,
                            int64_t n, int64_t k, int64_t d) {
  // One pass over each (token, choice): dy's row stays in L1 across the k choices, out's row is
  // read once and dout's row written once.
  const bool streaming = streams<T>(n * k, d);
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    ChunkOut<T> chunk(streaming);
    for (int64_t t = lo; t < hi; ++t) {
      const T* g = dy + t * d;
      const int32_t* next_pos = t + 1 < hi ? pos + (t + 1) * k : nullptr;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = pos[t * k + j];
        const float wj = w[t * k + j];
        T* dst = dout + p * d;
        const T* o = out + p * d;
        float dot = 0;
        for (int64_t j0 = 0; j0 < d; j0 += kChunk) {
          const int64_t j1 = chunk_end(j0, d);
          if (next_pos) prefetch_to_l2(out + int64_t(next_pos[j]) * d, j0, j1);
          dot += scale_and_dot(chunk.at(dst, j0), g + j0, o + j0, wj, j1 - j0);
          chunk.flush(dst, j0, j1);
        }
        dw[t * k + j] += dot;
      }
    }
    if (streaming) streaming_done();
  });
}

#define TITAN_INSTANTIATE(T)                                                                                     \
  template void moe_permute_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                 \
  template void moe_permute_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                \
  template void moe_unpermute_forward<T>(T*, const T*, const int32_t*, const float*, int64_t, int64_t, int64_t); \
  template void moe_unpermute_backward<T>(T*, float*, const T*, const T*, const int32_t*, const float*, int64_t,  \
                                          int64_t, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
