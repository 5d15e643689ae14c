#include "titan/kernels/cpu/sinkhorn.h"

#include <algorithm>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

// mHC's matrices are tiny (N = hc_mult = 4: 16 entries) and there is one per token and layer, so
// the kernel runs kLanes tokens side by side: a block is laid out entry-major ([N*N][kLanes]),
// every row or column sum is then a sum of whole lane vectors, and each loop over the lanes
// vectorizes at any ISA level. Backward recomputes the block's iterations, keeping each step's
// output and sums in scratch ((2 iters - 1) x (N*N + N) x kLanes floats), then runs them in reverse.
namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr int64_t kLanes = 16;
using Lanes = float[kLanes];

// z = rowsoftmax(block of logits) (the rows of each token's matrix), gathered into lanes: token
// t0 + l's entry e lands in z[e][l]; missing tokens (a short last block) get zeros.
void softmax_block(Lanes* q, const float* logits, int64_t t0, int64_t count, int64_t n) {
  const int64_t nn = n * n;
  for (int64_t e = 0; e < nn; ++e)
    for (int64_t l = 0; l < kLanes; ++l) q[e][l] = l < count ? logits[(t0 + l) * nn + e] : 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    Lanes m, s;
    for (int64_t l = 0; l < kLanes; ++l) m[l] = q[j * n][l], s[l] = 0;
    for (int64_t k = 1; k < n; ++k)
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) m[l] = std::max(m[l], q[j * n + k][l]);
    for (int64_t k = 0; k < n; ++k)
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) q[j * n + k][l] = fast_exp(q[j * n + k][l] - m[l]), s[l] += q[j * n + k][l];
    for (int64_t k = 0; k < n; ++k)
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) q[j * n + k][l] /= s[l];
  }
}

// One normalisation of z in place along rows (columns = false) or columns; its sums into s[N].
void normalise(Lanes* z, Lanes* s, int64_t n, bool columns, float eps) {
  for (int64_t a = 0; a < n; ++a)
    for (int64_t l = 0; l < kLanes; ++l) s[a][l] = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < n; ++k) {
      Lanes& sum = s[columns ? k : j];
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) sum[l] += z[j * n + k][l];
    }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < n; ++k) {
      const Lanes& sum = s[columns ? k : j];
#pragma omp simd
      for (int64_t l = 0; l < kLanes; ++l) z[j * n + k][l] /= sum[l] + eps;
    }
}

// The forward of one block: q the softmax; with `steps` (may be null) each normalisation's output
// and sums kept at steps + i * (N*N + N). Returns the final iterate (in z).
void forward_block(Lanes* z, Lanes* q, Lanes* steps, Lanes* sums, const float* logits, int64_t t0, int64_t count,
                   int64_t n, int iters, float eps) {
  const int64_t nn = n * n;
  softmax_block(q, logits, t0, count, n);
  for (int64_t e = 0; e < nn; ++e)
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) z[e][l] = q[e][l] + eps;
  for (int i = 0; i < 2 * iters - 1; ++i) {
    Lanes* s = steps ? sums + i * n : sums;
    normalise(z, s, n, i % 2 == 0, eps);
    if (steps) std::copy(&z[0][0], &z[0][0] + nn * kLanes, &steps[i * nn][0]);
  }
}

}  // namespace

void sinkhorn_forward(float* p, const float* logits, int64_t tokens, int64_t n, int iters, double eps) {
  const int64_t nn = n * n, blocks = (tokens + kLanes - 1) / kLanes;
  parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    Scratch<Lanes> scratch(2 * nn + n);
    Lanes *z = scratch.data(), *q = z + nn, *sums = q + nn;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t0 = b * kLanes, count = std::min(kLanes, tokens - t0);
      forward_block(z, q, nullptr, sums, logits, t0, count, n, iters, float(eps));
      for (int64_t e = 0; e < nn; ++e)
        for (int64_t l = 0; l < count; ++l) p[(t0 + l) * nn + e] = z[e][l];
    }
  });
}

void sinkhorn_backward(float* dlogits, const float* dp, const float* logits, int64_t tokens, int64_t n, int iters,
                       double eps) {
  const int64_t nn = n * n, blocks = (tokens + kLanes - 1) / kLanes, normalisations = 2 * iters - 1;
  const float e = float(eps);
  parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    Scratch<Lanes> scratch(3 * nn + n + normalisations * (nn + n));
    Lanes *z = scratch.data(), *q = z + nn, *dy = q + nn, *dot = dy + nn, *steps = dot + n, *sums = steps + normalisations * nn;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t t0 = b * kLanes, count = std::min(kLanes, tokens - t0);
      forward_block(z, q, steps, sums, logits, t0, count, n, iters, e);
      for (int64_t x = 0; x < nn; ++x)
        for (int64_t l = 0; l < kLanes; ++l) dy[x][l] = l < count ? dp[(t0 + l) * nn + x] : 0.0f;
      // Each normalisation in reverse: dZ = (dY - sum_axis dY * Y) / (s + eps).
      for (int64_t i = normalisations - 1; i >= 0; --i) {
        const bool columns = i % 2 == 0;
        const Lanes *y = steps + i * nn, *s = sums + i * n;
        for (int64_t a = 0; a < n; ++a)
          for (int64_t l = 0; l < kLanes; ++l) dot[a][l] = 0;
        for (int64_t j = 0; j < n; ++j)
          for (int64_t k = 0; k < n; ++k) {
            Lanes& d = dot[columns ? k : j];
#pragma omp simd
            for (int64_t l = 0; l < kLanes; ++l) d[l] += dy[j * n + k][l] * y[j * n + k][l];
          }
        for (int64_t j = 0; j < n; ++j)
          for (int64_t k = 0; k < n; ++k) {
            const int64_t a = columns ? k : j;
#pragma omp simd
            for (int64_t l = 0; l < kLanes; ++l) dy[j * n + k][l] = (dy[j * n + k][l] - dot[a][l]) / (s[a][l] + e);
          }
      }
      // dy is dQ (the + eps passes it); the row softmax, added into dlogits.
      for (int64_t j = 0; j < n; ++j) {
        Lanes d;
        for (int64_t l = 0; l < kLanes; ++l) d[l] = 0;
        for (int64_t k = 0; k < n; ++k)
#pragma omp simd
          for (int64_t l = 0; l < kLanes; ++l) d[l] += dy[j * n + k][l] * q[j * n + k][l];
        for (int64_t k = 0; k < n; ++k)
          for (int64_t l = 0; l < count; ++l)
            dlogits[(t0 + l) * nn + j * n + k] += q[j * n + k][l] * (dy[j * n + k][l] - d[l]);
      }
    }
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
