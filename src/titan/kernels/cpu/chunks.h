// Chunked passes over a row or span (per-ISA namespace, as cpu/isa.h requires): the last pass of
// a row kernel runs in chunks of kChunk elements, which lets it
//  - prefetch the next row: a row kernel reads each row from memory once (its first pass) and
//    then works on it from cache; interleaving prefetches of the next row into the last cache
//    pass keeps memory busy meanwhile, so a row costs max(memory, arithmetic), not their sum;
//  - round bf16 outputs in bulk: results go to an f32 chunk in L1 and are rounded to bf16 with
//    one AVX512_BF16 instruction per 32 values, about 4x fewer instructions than the integer
//    rounding GCC vectorizes f32_to_bf16 into (it was the largest cost of bf16 kernels).
#pragma once

#include <cstdint>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

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

// Where a chunked pass writes its f32 results for elements [j0, j1) of a T row: straight into the
// row when T is float; otherwise into an L1 buffer that flush() rounds into the row.
template <class T>
class ChunkOut {
 public:
  float* at(T* row, int64_t j0) {
    if constexpr (std::is_same_v<T, float>) {
      return row + j0;
    } else {
      return buf_;
    }
  }
  void flush(T* row, int64_t j0, int64_t j1) {
    if constexpr (!std::is_same_v<T, float>) round_to_bf16(row + j0, buf_, j1 - j0);
  }

 private:
  alignas(64) float buf_[std::is_same_v<T, float> ? 1 : kChunk];
};

}  // namespace titan::kernels::cpu::TITAN_ISA
