// Pieces shared by the kernels that run every query head against the same gathered key rows
// (MQA over a per-query row set: sparse MLA's selected latent rows, DeepSeek-V4's window and
// compressed entries). Per-ISA like isa.h: these live in the per-ISA namespace.
#pragma once

#include <cstdint>
#include <type_traits>

#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/tile_gemm.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

// The products' register tiles (cpu/tile_gemm.h), depth unchunked. AVX-512 uses 8 x 3: 16 heads
// fill two row tiles exactly, and a one-vector tile (the scores of 16 heads) still has 8
// independent FMA chains (about 8% less CPU time than 6 x 4 at H = 16). Every product's rows are
// padded to whole row tiles by the caller.
struct MqaTiles : TileDefaults {
#if defined(__AVX512F__)
  static constexpr int kRows = 8, kVecs = 3;
#elif defined(__AVX2__)
  static constexpr int kRows = 6, kVecs = 2;
#else
  static constexpr int kRows = 4, kVecs = 2;
#endif
  static constexpr int kNarrowRows = kRows;
  static constexpr bool kRowTails = false;
};

// dst[c * ld_dst + r] = scale * src[r * ld_src + c] for r < rows, c < cols: the heads' rows of q
// (or dO) as the head columns of a B operand. Whole 16 x 16 f32 blocks are transposed in
// shuffles; the rest (partial blocks, bf16) element by element. Element by element throughout,
// with each store ld_dst floats past the last, this cost a query about as many scalar operations
// (~35k at H = 16, Dqk + Dv = 1088) as its score product has vector FMAs.
template <class T>
void transpose_heads(float* dst, int64_t ld_dst, const T* src, int64_t ld_src, int64_t rows, int64_t cols,
                     float scale) {
  int64_t rows_done = 0, cols_done = 0;  // the block [0, rows_done) x [0, cols_done) done in shuffles
#if defined(TITAN_AVX512_ROWS)
  if constexpr (std::is_same_v<T, float>) {
    rows_done = rows / 16 * 16, cols_done = cols / 16 * 16;
    alignas(64) uint32_t blk[16 * 16];
    const __m512 sv = _mm512_set1_ps(scale);
    for (int64_t r0 = 0; r0 < rows_done; r0 += 16) {
      for (int64_t c0 = 0; c0 < cols_done; c0 += 16) {
        transpose16_u32(blk, 16, reinterpret_cast<const uint32_t*>(src + r0 * ld_src + c0), ld_src);
        // Scalar math: dst[c0 + i][r0, r0 + 16) = scale * (the 16 x 16 block of src, transposed)[i]
        for (int64_t i = 0; i < 16; ++i) {
          _mm512_storeu_ps(dst + (c0 + i) * ld_dst + r0,
                           _mm512_mul_ps(sv, _mm512_castsi512_ps(_mm512_load_si512(blk + 16 * i))));
        }
      }
    }
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    // Scalar math: dst[c][r] = scale * src[r][c]
    for (int64_t c = r < rows_done ? cols_done : 0; c < cols; ++c) dst[c * ld_dst + r] = scale * to_f32(src[r * ld_src + c]);
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
