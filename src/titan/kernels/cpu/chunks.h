// Chunked passes over a row or span (per-ISA namespace, as cpu/isa.h requires): the last pass of
// a row kernel runs in chunks of kChunk elements, which lets it
//  - prefetch the next row: a row kernel reads each row from memory once (its first pass) and
//    then works on it from cache; interleaving prefetches of the next row into the last cache
//    pass keeps memory busy meanwhile, so a row costs max(memory, arithmetic), not their sum;
//  - round bf16 outputs in bulk: results go to an f32 chunk in L1 and are rounded to bf16 with
//    one AVX512_BF16 instruction per 32 values, about 4x fewer instructions than the integer
//    rounding GCC vectorizes f32_to_bf16 into (it was the largest cost of bf16 kernels);
//  - write large outputs with streaming stores: a plain store first reads the line it writes
//    (read-for-ownership), so an output costs twice its size in traffic; a streaming store
//    writes whole lines without reading them. Measured here: a streaming copy loop moves ~1.3x
//    the bytes per second of memcpy, a plain-store one the same as memcpy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// Elements per chunk: 2 KiB of f32, enough work to hide a prefetch burst and few enough lines
// per burst not to stall on the outstanding-miss queue.
inline constexpr int64_t kChunk = 512;

// The end of the chunk that starts at j0 in a row of D elements.
TITAN_INLINE int64_t chunk_end(int64_t j0, int64_t D) { return j0 + kChunk < D ? j0 + kChunk : D; }

// Requests elements [j0, j1) of the next row into L2 (prefetcht1: they are read only after this
// row's work, and L1 is busy with this row). A null row (no next row) does nothing.
template <class T>
TITAN_INLINE void prefetch_to_l2(const T* row, int64_t j0, int64_t j1) {
  if (!row) return;
  const char* end = reinterpret_cast<const char*>(row + j1);
  for (const char* p = reinterpret_cast<const char*>(row + j0); p < end; p += 64) __builtin_prefetch(p, 0, 2);
}

// In a streaming pass over [0, n), requests the chunk kPrefetchAhead elements past [j0, j1)
// (clipped to n): hardware prefetchers alone leave the exp-heavy span kernels waiting on memory.
inline constexpr int64_t kPrefetchAhead = 4 * kChunk;
template <class T>
TITAN_INLINE void prefetch_ahead(const T* span, int64_t j0, int64_t j1, int64_t n) {
  const int64_t lo = j0 + kPrefetchAhead, hi = j1 + kPrefetchAhead < n ? j1 + kPrefetchAhead : n;
  if (lo < hi) prefetch_to_l2(span, lo, hi);
}

// dst[0, n) = bf16(src[0, n)), round to nearest even (NaN stays NaN), as f32_to_bf16.
TITAN_INLINE void round_to_bf16(bf16* dst, const float* src, int64_t n) {
  int64_t j = 0;
#if defined(__AVX512BF16__)
  for (; j + 32 <= n; j += 32) {
    const __m512 lo = _mm512_loadu_ps(src + j), hi = _mm512_loadu_ps(src + j + 16);
    _mm512_storeu_si512(dst + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
#endif
  // Scalar math: dst = f32_to_bf16(src)
#pragma omp simd
  for (int64_t i = j; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

// Outputs at least this large use streaming stores: they outlive the L2 caches and most of a
// shared L3 before the next kernel reads them, so keeping them in cache buys nothing. Smaller
// outputs stay cached for their consumer. Backward gradients are read before they are written
// (they accumulate), so they never need this.
inline constexpr int64_t kStreamingBytes = int64_t(16) << 20;

// dst[0, bytes) = src[0, bytes) with streaming stores where dst is 16-byte aligned (64 with
// AVX-512), plain copies for the unaligned head and the tail. Call streaming_done() before
// another thread may read dst.
TITAN_INLINE void stream_bytes(void* dst, const void* src, int64_t bytes) {
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
#if defined(__AVX512F__)
  constexpr int64_t kLine = 64;
#else
  constexpr int64_t kLine = 16;
#endif
  int64_t head = int64_t((kLine - reinterpret_cast<uintptr_t>(d) % kLine) % kLine);
  head = head < bytes ? head : bytes;
  std::memcpy(d, s, size_t(head));
  int64_t k = head;
  for (; k + kLine <= bytes; k += kLine) {
#if defined(__AVX512F__)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(d + k), _mm512_loadu_si512(s + k));
#else
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
#endif
  }
  std::memcpy(d + k, s + k, size_t(bytes - k));
}

// Orders this thread's streaming stores before its later stores (and so before the end of its
// parallel region): streaming stores are weakly ordered.
TITAN_INLINE void streaming_done() { _mm_sfence(); }

// Where a chunked pass writes its f32 results for elements [j0, j1) of a T row, and how they get
// there. Plain float outputs are written in place; bf16 outputs go through an L1 chunk that
// flush() rounds into the row; streaming outputs go through L1 chunks that flush() streams out.
template <class T>
class ChunkOut {
 public:
  explicit ChunkOut(bool streaming = false) : streaming_(streaming) {}
  float* at(T* row, int64_t j0) {
    if constexpr (std::is_same_v<T, float>) {
      if (!streaming_) return row + j0;
    }
    return buf_;
  }
  void flush(T* row, int64_t j0, int64_t j1) {
    if (streaming_) {
      if constexpr (std::is_same_v<T, float>) {
        stream_bytes(row + j0, buf_, (j1 - j0) * int64_t(sizeof(float)));
      } else {
        round_to_bf16(rounded_, buf_, j1 - j0);
        stream_bytes(row + j0, rounded_, (j1 - j0) * int64_t(sizeof(bf16)));
      }
    } else if constexpr (!std::is_same_v<T, float>) {
      round_to_bf16(row + j0, buf_, j1 - j0);
    }
  }

 private:
  bool streaming_;
  alignas(64) float buf_[kChunk];
  alignas(64) bf16 rounded_[std::is_same_v<T, float> ? 1 : kChunk];
};

}  // namespace titan::kernels::cpu::TITAN_ISA
