#include "titan/kernels/cpu/norm.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/chunks.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

// Every kernel here reads each row from memory once: the first pass over a row (its sum of
// squares, or its dot product in backward) pulls it into L1/L2 and the later passes over the same
// row hit the cache (a row of up to ~1 MiB fits in L2, far above any model dim). The last pass
// runs in chunks (cpu/chunks.h) that prefetch the next row, so memory stays busy while the cache
// passes compute, round bf16 outputs in bulk, and stream large forward outputs to memory.
namespace titan::kernels::cpu::TITAN_ISA {

namespace {

// Rows per thread chunk: enough that a chunk holds ~32K elements.
TITAN_INLINE int64_t row_grain(int64_t D) { return D >= (1 << 15) ? 1 : (1 << 15) / D; }

// Weight gradients are summed over fixed blocks of rows, one partial vector per block, and the
// partials are then added in block order. The blocks do not depend on the thread count, so dw is
// bit-identical on any number of threads (a resumed run continues exactly). 64 rows per block
// keeps the partials small next to the activations (1/64 of one [N, D] f32 tensor).
constexpr int64_t kRowsPerBlock = 64;

// dst[j] += partial_b[j] for b = 0, 1, ... in order; partial b starts at partials + b * stride.
void add_block_partials(float* dst,             // [D]
                        const float* partials,  // [blocks, stride]
                        int64_t blocks, int64_t stride, int64_t D) {
  parallel_for(0, D, 1024, [&](int64_t lo, int64_t hi) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* p = partials + b * stride;
      // Scalar math: dst += p
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) dst[j] += p[j];
    }
  });
}

// Chunks of whole blocks hold ~32K elements each.
TITAN_INLINE int64_t block_grain(int64_t D) {
  const int64_t per_block = kRowsPerBlock * D;
  return per_block >= (1 << 15) ? 1 : (1 << 15) / per_block;
}

// next: the next row's offset from this one (0: none), prefetched during the last pass.
// streaming: write y with streaming stores (cpu/chunks.h).
template <class T>
TITAN_INLINE float rmsnorm_forward_row(T* y, const T* x, const float* w, int64_t D, float eps, int64_t next,
                                       bool streaming) {
  float ss = 0;
  // Scalar math: ss = sum_j x_j^2
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < D; ++j) {
    const float v = to_f32(x[j]);
    ss += v * v;
  }
  const float r = 1.0f / __builtin_sqrtf(ss / float(D) + eps);
  ChunkOut<T> out(streaming);
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    float* o = out.at(y, j0);
    // Scalar math: y_j = x_j * r * w_j
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) o[j - j0] = to_f32(x[j]) * r * w[j];
    out.flush(y, j0, j1);
  }
  return r;
}

// pw: this row's block partial of dw, or null when dw is not wanted. next: the next row's offset
// from this one (0: none).
template <class T>
TITAN_INLINE void rmsnorm_backward_row(T* dx, float* pw, float r, const T* dy, const T* x, const float* w, int64_t D,
                                       int64_t next) {
  float dot = 0;
  // Scalar math: dot = sum_j dy_j * w_j * x_j
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < D; ++j) dot += to_f32(dy[j]) * w[j] * to_f32(x[j]);
  const float c = dot * r * r * r / float(D);
  ChunkOut<T> out;
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? dy + next : nullptr, j0, j1);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    prefetch_to_l2(next ? dx + next : nullptr, j0, j1);
    float* o = out.at(dx, j0);
    if (pw) {
      // Scalar math: dx_j += r * w_j * dy_j - c * x_j; pw_j += dy_j * x_j * r
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        const float g = to_f32(dy[j]), v = to_f32(x[j]);
        o[j - j0] = to_f32(dx[j]) + r * w[j] * g - c * v;
        pw[j] += g * v * r;
      }
    } else {
      // Scalar math: dx_j += r * w_j * dy_j - c * x_j
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) o[j - j0] = to_f32(dx[j]) + r * w[j] * to_f32(dy[j]) - c * to_f32(x[j]);
    }
    out.flush(dx, j0, j1);
  }
}

// next and streaming as in rmsnorm_forward_row.
template <class T>
TITAN_INLINE void layernorm_forward_row(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b,
                                        int64_t D, float eps, int64_t next, bool streaming) {
  float s = 0;
  // Scalar math: s = sum_j x_j
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < D; ++j) s += to_f32(x[j]);
  const float mu = s / float(D);
  float ss = 0;
  // Scalar math: ss = sum_j (x_j - mu)^2 (deviations, so no cancellation when |mu| >> std)
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < D; ++j) {
    const float d = to_f32(x[j]) - mu;
    ss += d * d;
  }
  const float r = 1.0f / __builtin_sqrtf(ss / float(D) + eps);
  *mean = mu;
  *rstd = r;
  ChunkOut<T> out(streaming);
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    float* o = out.at(y, j0);
    // Scalar math: y_j = (x_j - mu) * r * w_j + b_j
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) o[j - j0] = (to_f32(x[j]) - mu) * r * w[j] + b[j];
    out.flush(y, j0, j1);
  }
}

// pw, pb: this row's block partials of dw and db, or both null when neither is wanted. next: the
// next row's offset from this one (0: none).
template <class T>
TITAN_INLINE void layernorm_backward_row(T* dx, float* pw, float* pb, float mu, float r, const T* dy, const T* x,
                                         const float* w, int64_t D, int64_t next) {
  float sum_g = 0, sum_gx = 0;
  // Scalar math: sum_g = sum_j dy_j w_j; sum_gx = sum_j dy_j w_j xhat_j, xhat = (x - mu) r
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < D; ++j) {
    const float g = to_f32(dy[j]) * w[j];
    sum_g += g;
    sum_gx += g * (to_f32(x[j]) - mu) * r;
  }
  const float mean_g = sum_g / float(D), mean_gx = sum_gx / float(D);
  ChunkOut<T> out;
  for (int64_t j0 = 0; j0 < D; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, D);
    prefetch_to_l2(next ? dy + next : nullptr, j0, j1);
    prefetch_to_l2(next ? x + next : nullptr, j0, j1);
    prefetch_to_l2(next ? dx + next : nullptr, j0, j1);
    float* o = out.at(dx, j0);
    if (pw) {
      // Scalar math: dx_j += r (dy_j w_j - mean_g - xhat_j mean_gx); pw_j += dy_j xhat_j; pb_j += dy_j
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        const float d = to_f32(dy[j]), xhat = (to_f32(x[j]) - mu) * r;
        o[j - j0] = to_f32(dx[j]) + r * (d * w[j] - mean_g - xhat * mean_gx);
        pw[j] += d * xhat;
        pb[j] += d;
      }
    } else {
      // Scalar math: dx_j += r (dy_j w_j - mean_g - xhat_j mean_gx)
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) {
        const float xhat = (to_f32(x[j]) - mu) * r;
        o[j - j0] = to_f32(dx[j]) + r * (to_f32(dy[j]) * w[j] - mean_g - xhat * mean_gx);
      }
    }
    out.flush(dx, j0, j1);
  }
}

TITAN_INLINE void zero(float* p, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) p[j] = 0.0f;
}

}  // namespace

template <class T>
void rmsnorm_forward(T* y, float* rstd, const T* x, const float* w, int64_t N, int64_t D, float eps) {
  const bool streaming = N * D * int64_t(sizeof(T)) >= kStreamingBytes;
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      rstd[i] = rmsnorm_forward_row(y + i * D, x + i * D, w, D, eps, i + 1 < hi ? D : 0, streaming);
    if (streaming) streaming_done();
  });
}

template <class T>
void rmsnorm_backward(T* dx, float* dw, const float* rstd, const T* dy, const T* x, const float* w, int64_t N,
                      int64_t D) {
  if (N == 0) return;
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  Scratch<float> partials(dw ? blocks * D : 0);  // [blocks, D]
  parallel_for(0, blocks, block_grain(D), [&](int64_t block_lo, int64_t block_hi) {
    const int64_t last_row = block_hi * kRowsPerBlock < N ? block_hi * kRowsPerBlock : N;  // this chunk's end
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      float* pw = dw ? partials.data() + blk * D : nullptr;  // [D]
      if (pw) zero(pw, D);
      const int64_t row_end = (blk + 1) * kRowsPerBlock < N ? (blk + 1) * kRowsPerBlock : N;
      for (int64_t i = blk * kRowsPerBlock; i < row_end; ++i)
        rmsnorm_backward_row(dx + i * D, pw, rstd[i], dy + i * D, x + i * D, w, D, i + 1 < last_row ? D : 0);
    }
  });
  if (dw) add_block_partials(dw, partials.data(), blocks, D, D);
}

template <class T>
void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b, int64_t N,
                       int64_t D, float eps) {
  const bool streaming = N * D * int64_t(sizeof(T)) >= kStreamingBytes;
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      layernorm_forward_row(y + i * D, mean + i, rstd + i, x + i * D, w, b, D, eps, i + 1 < hi ? D : 0, streaming);
    if (streaming) streaming_done();
  });
}

template <class T>
void layernorm_backward(T* dx, float* dw, float* db, const float* mean, const float* rstd, const T* dy, const T* x,
                        const float* w, int64_t N, int64_t D) {
  if (N == 0) return;
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool param_grads = dw || db;
  Scratch<float> partials(param_grads ? blocks * 2 * D : 0);  // [blocks, 2, D]: dw then db
  parallel_for(0, blocks, block_grain(D), [&](int64_t block_lo, int64_t block_hi) {
    const int64_t last_row = block_hi * kRowsPerBlock < N ? block_hi * kRowsPerBlock : N;  // this chunk's end
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      float* pw = param_grads ? partials.data() + blk * 2 * D : nullptr;  // [D]
      float* pb = param_grads ? pw + D : nullptr;                         // [D]
      if (param_grads) zero(pw, 2 * D);
      const int64_t row_end = (blk + 1) * kRowsPerBlock < N ? (blk + 1) * kRowsPerBlock : N;
      for (int64_t i = blk * kRowsPerBlock; i < row_end; ++i)
        layernorm_backward_row(dx + i * D, pw, pb, mean[i], rstd[i], dy + i * D, x + i * D, w, D,
                               i + 1 < last_row ? D : 0);
    }
  });
  if (dw) add_block_partials(dw, partials.data(), blocks, 2 * D, D);
  if (db) add_block_partials(db, partials.data() + D, blocks, 2 * D, D);
}

#define TITAN_INSTANTIATE(T)                                                                                  \
  template void rmsnorm_forward<T>(T*, float*, const T*, const float*, int64_t, int64_t, float);              \
  template void rmsnorm_backward<T>(T*, float*, const float*, const T*, const T*, const float*, int64_t,      \
                                    int64_t);                                                                 \
  template void layernorm_forward<T>(T*, float*, float*, const T*, const float*, const float*, int64_t,       \
                                     int64_t, float);                                                         \
  template void layernorm_backward<T>(T*, float*, float*, const float*, const float*, const T*, const T*,     \
                                      const float*, int64_t, int64_t);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
