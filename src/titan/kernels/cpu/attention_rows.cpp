#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/attention_rows.h"

namespace titan::kernels::cpu::TITAN_ISA {

void online_softmax_rows(float* s, int64_t ld, int64_t rows, int64_t cols, float* m, float* l, float* alpha) {
  for (int64_t i = 0; i < rows; ++i) {
    float* si = s + i * ld;
    float mx = m[i];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < cols; ++j) mx = si[j] > mx ? si[j] : mx;
    alpha[i] = fast_exp(m[i] - mx);  // exp(-inf) = 0: the first tile
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < cols; ++j) {
      si[j] = fast_exp(si[j] - mx);
      sum += si[j];
    }
    l[i] = l[i] * alpha[i] + sum;
    m[i] = mx;
  }
}

void probability_rows(float* p, float* ds, int64_t ld, int64_t rows, int64_t cols, const float* lse,
                      const float* delta) {
  for (int64_t i = 0; i < rows; ++i) {
    float* pi = p + i * ld;
    float* di = ds + i * ld;
    const float li = lse[i], dd = delta[i];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      pi[j] = fast_exp(pi[j] - li);
      di[j] = pi[j] * (di[j] - dd);
    }
  }
}

}  // namespace titan::kernels::cpu::TITAN_ISA
