#include "titan/kernels/cpu/cross_entropy.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
constexpr int64_t kChunk = 4096;  // vocabulary entries per chunk: 16 KiB of f32, stays in L1 between its two reads
constexpr float kInf = __builtin_inff();
}  // namespace

template <class T>
void cross_entropy_forward(float* loss, float* lse, const T* logits, const int32_t* targets, int64_t n, int64_t v,
                           int32_t ignore_index) {
  parallel_for(0, n, (1 << 15) / v + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      if (targets[r] == ignore_index) {
        loss[r] = 0;
        lse[r] = 0;
        continue;
      }
      const T* row = logits + r * v;
      float m = -kInf, s = 0;  // running max and sum of exp(x - m)
      for (int64_t c0 = 0; c0 < v; c0 += kChunk) {
        const int64_t c1 = c0 + kChunk < v ? c0 + kChunk : v;
        float cm = -kInf;
        // Scalar math: cm = max(x)
#pragma omp simd reduction(max : cm)
        for (int64_t j = c0; j < c1; ++j) cm = cm > to_f32(row[j]) ? cm : to_f32(row[j]);
        if (cm == -kInf) continue;  // all -inf: adds nothing (and -inf - -inf would be NaN)
        if (cm > m) {
          s *= fast_exp(m - cm);
          m = cm;
        }
        float cs = 0;
        // Scalar math: cs += exp(x - m)
#pragma omp simd reduction(+ : cs)
        for (int64_t j = c0; j < c1; ++j) cs += fast_exp(to_f32(row[j]) - m);
        s += cs;
      }
      lse[r] = m + __builtin_logf(s);  // the libm call, not an inline wrapper shared across ISA variants
      loss[r] = lse[r] - to_f32(row[targets[r]]);
    }
  });
}

template <class T>
void cross_entropy_backward(T* dlogits, const T* logits, const int32_t* targets, const float* lse, const float* dloss,
                            float scale, int64_t n, int64_t v, int32_t ignore_index) {
  parallel_for(0, n, (1 << 15) / v + 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      T* out = dlogits + r * v;
      const int32_t t = targets[r];
      if (t == ignore_index) {
        // Scalar math: dlogits = 0
#pragma omp simd
        for (int64_t j = 0; j < v; ++j) out[j] = from_f32<T>(0.0f);
        continue;
      }
      const T* row = logits + r * v;
      const float g = scale * (dloss ? dloss[r] : 1.0f);
      const float l = lse[r];
      const float target_logit = to_f32(row[t]);  // read before the loop: out may be row
      // Scalar math: dlogits = exp(x - lse) * g
#pragma omp simd
      for (int64_t j = 0; j < v; ++j) out[j] = from_f32<T>(fast_exp(to_f32(row[j]) - l) * g);
      out[t] = from_f32<T>((fast_exp(target_logit - l) - 1.0f) * g);
    }
  });
}

template void cross_entropy_forward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, int32_t);
template void cross_entropy_forward<bf16>(float*, float*, const bf16*, const int32_t*, int64_t, int64_t, int32_t);
template void cross_entropy_backward<float>(float*, const float*, const int32_t*, const float*, const float*, float,
                                            int64_t, int64_t, int32_t);
template void cross_entropy_backward<bf16>(bf16*, const bf16*, const int32_t*, const float*, const float*, float,
                                           int64_t, int64_t, int32_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
