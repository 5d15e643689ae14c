#include "titan/kernels/cpu/norm.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

// Every kernel here reads each row from memory once: the first pass over a row (its sum of
// squares, or its dot product in backward) pulls it into L1/L2 and the later passes over the same
// row hit the cache. A row of up to ~1 MiB fits in L2, far above any model dim.
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

}  // namespace

template <class T>
void rmsnorm_forward(T* y, float* rstd, const T* x, const float* w, int64_t N, int64_t D, float eps) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* xi = x + i * D;  // [D]
      T* yi = y + i * D;        // [D]
      float ss = 0;
      // Scalar math: ss = sum_j x_j^2
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < D; ++j) {
        const float v = to_f32(xi[j]);
        ss += v * v;
      }
      const float r = 1.0f / __builtin_sqrtf(ss / float(D) + eps);
      rstd[i] = r;
      // Scalar math: y_j = x_j * r * w_j
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) yi[j] = from_f32<T>(to_f32(xi[j]) * r * w[j]);
    }
  });
}

template <class T>
void rmsnorm_backward(T* dx, float* dw, const float* rstd, const T* dy, const T* x, const float* w, int64_t N,
                      int64_t D) {
  if (N == 0) return;
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  Scratch<float> partials(dw ? blocks * D : 0);
  parallel_for(0, blocks, block_grain(D), [&](int64_t block_lo, int64_t block_hi) {
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      float* pw = dw ? partials.data() + blk * D : nullptr;  // [D] this block's share of dw
      if (pw) {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) pw[j] = 0.0f;
      }
      const int64_t row_end = blk * kRowsPerBlock + kRowsPerBlock < N ? blk * kRowsPerBlock + kRowsPerBlock : N;
      for (int64_t i = blk * kRowsPerBlock; i < row_end; ++i) {
        const T* xi = x + i * D;    // [D]
        const T* dyi = dy + i * D;  // [D]
        T* dxi = dx + i * D;        // [D]
        const float r = rstd[i];
        float dot = 0;
        // Scalar math: dot = sum_j dy_j * w_j * x_j
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < D; ++j) dot += to_f32(dyi[j]) * w[j] * to_f32(xi[j]);
        const float c = dot * r * r * r / float(D);
        if (pw) {
          // Scalar math: dx_j += r * w_j * dy_j - c * x_j; pw_j += dy_j * x_j * r
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) {
            const float g = to_f32(dyi[j]), v = to_f32(xi[j]);
            dxi[j] = from_f32<T>(to_f32(dxi[j]) + r * w[j] * g - c * v);
            pw[j] += g * v * r;
          }
        } else {
          // Scalar math: dx_j += r * w_j * dy_j - c * x_j
#pragma omp simd
          for (int64_t j = 0; j < D; ++j)
            dxi[j] = from_f32<T>(to_f32(dxi[j]) + r * w[j] * to_f32(dyi[j]) - c * to_f32(xi[j]));
        }
      }
    }
  });
  if (dw) add_block_partials(dw, partials.data(), blocks, D, D);
}

template <class T>
void layernorm_forward(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b, int64_t N,
                       int64_t D, float eps) {
  parallel_for(0, N, row_grain(D), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const T* xi = x + i * D;  // [D]
      T* yi = y + i * D;        // [D]
      float s = 0;
      // Scalar math: s = sum_j x_j
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < D; ++j) s += to_f32(xi[j]);
      const float mu = s / float(D);
      float ss = 0;
      // Scalar math: ss = sum_j (x_j - mu)^2 (deviations, so no cancellation when |mu| >> std)
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < D; ++j) {
        const float d = to_f32(xi[j]) - mu;
        ss += d * d;
      }
      const float r = 1.0f / __builtin_sqrtf(ss / float(D) + eps);
      mean[i] = mu;
      rstd[i] = r;
      // Scalar math: y_j = (x_j - mu) * r * w_j + b_j
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) yi[j] = from_f32<T>((to_f32(xi[j]) - mu) * r * w[j] + b[j]);
    }
  });
}

template <class T>
void layernorm_backward(T* dx, float* dw, float* db, const float* mean, const float* rstd, const T* dy, const T* x,
                        const float* w, int64_t N, int64_t D) {
  if (N == 0) return;
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool param_grads = dw || db;
  // Block b's partials: dw at [b, 0, :], db at [b, 1, :].
  Scratch<float> partials(param_grads ? blocks * 2 * D : 0);
  parallel_for(0, blocks, block_grain(D), [&](int64_t block_lo, int64_t block_hi) {
    for (int64_t blk = block_lo; blk < block_hi; ++blk) {
      float* pw = param_grads ? partials.data() + blk * 2 * D : nullptr;  // [D]
      float* pb = param_grads ? pw + D : nullptr;                         // [D]
      if (param_grads) {
#pragma omp simd
        for (int64_t j = 0; j < 2 * D; ++j) pw[j] = 0.0f;
      }
      const int64_t row_end = blk * kRowsPerBlock + kRowsPerBlock < N ? blk * kRowsPerBlock + kRowsPerBlock : N;
      for (int64_t i = blk * kRowsPerBlock; i < row_end; ++i) {
        const T* xi = x + i * D;    // [D]
        const T* dyi = dy + i * D;  // [D]
        T* dxi = dx + i * D;        // [D]
        const float mu = mean[i], r = rstd[i];
        float sum_g = 0, sum_gx = 0;
        // Scalar math: sum_g = sum_j dy_j w_j; sum_gx = sum_j dy_j w_j xhat_j, xhat = (x - mu) r
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < D; ++j) {
          const float g = to_f32(dyi[j]) * w[j];
          sum_g += g;
          sum_gx += g * (to_f32(xi[j]) - mu) * r;
        }
        const float mean_g = sum_g / float(D), mean_gx = sum_gx / float(D);
        if (param_grads) {
          // Scalar math: dx_j += r (dy_j w_j - mean_g - xhat_j mean_gx); pw_j += dy_j xhat_j; pb_j += dy_j
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) {
            const float d = to_f32(dyi[j]), xhat = (to_f32(xi[j]) - mu) * r;
            dxi[j] = from_f32<T>(to_f32(dxi[j]) + r * (d * w[j] - mean_g - xhat * mean_gx));
            pw[j] += d * xhat;
            pb[j] += d;
          }
        } else {
          // Scalar math: dx_j += r (dy_j w_j - mean_g - xhat_j mean_gx)
#pragma omp simd
          for (int64_t j = 0; j < D; ++j) {
            const float xhat = (to_f32(xi[j]) - mu) * r;
            dxi[j] = from_f32<T>(to_f32(dxi[j]) + r * (to_f32(dyi[j]) * w[j] - mean_g - xhat * mean_gx));
          }
        }
      }
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
