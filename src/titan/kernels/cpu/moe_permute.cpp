#include "titan/kernels/cpu/moe_permute.h"

#include <type_traits>

#include "titan/kernels/cpu/row_ops.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Tokens per thread chunk so a chunk moves about 64 KiB of k rows: below that, threads cost more
// than they save.
int64_t token_grain(int64_t k, int64_t d) { return (1 << 14) / (k * d + 1) + 1; }

// An f32 row for accumulating one bf16 token (float rows accumulate in place), per thread chunk.
template <class T>
struct AccRow {
  explicit AccRow(int64_t d) : bytes(std::is_same_v<T, float> ? 0 : size_t(d) * sizeof(float)) {
    if (bytes) data = static_cast<float*>(memory_alloc(bytes, MemCategory::temporaries));
  }
  ~AccRow() {
    if (data) memory_free(data, bytes, MemCategory::temporaries);
  }
  AccRow(const AccRow&) = delete;
  AccRow& operator=(const AccRow&) = delete;
  size_t bytes;
  float* data = nullptr;
};
}  // namespace

template <class T>
void moe_permute_forward(T* xs, const T* x, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t)
      for (int64_t j = 0; j < k; ++j) std::memcpy(xs + int64_t(pos[t * k + j]) * d, x + t * d, size_t(d) * sizeof(T));
  });
}

template <class T>
void moe_permute_backward(T* dx, const T* dxs, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    AccRow<T> scratch(d);
    for (int64_t t = lo; t < hi; ++t) {
      T* out = dx + t * d;
      float* acc;
      if constexpr (std::is_same_v<T, float>) {
        acc = out;
      } else {
        acc = scratch.data;
        scale_row(acc, out, 1.0f, d);
      }
      for (int64_t j = 0; j < k; ++j) axpy_row(acc, dxs + int64_t(pos[t * k + j]) * d, 1.0f, d);
      if constexpr (!std::is_same_v<T, float>) scale_row(out, acc, 1.0f, d);
    }
  });
}

template <class T>
void moe_unpermute_forward(T* y, const T* out, const int32_t* pos, const float* w, int64_t n, int64_t k, int64_t d) {
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    AccRow<T> scratch(d);
    for (int64_t t = lo; t < hi; ++t) {
      float* acc = std::is_same_v<T, float> ? reinterpret_cast<float*>(y + t * d) : scratch.data;
      scale_row(acc, out + int64_t(pos[t * k]) * d, w[t * k], d);
      for (int64_t j = 1; j < k; ++j) axpy_row(acc, out + int64_t(pos[t * k + j]) * d, w[t * k + j], d);
      if constexpr (!std::is_same_v<T, float>) scale_row(y + t * d, acc, 1.0f, d);
    }
  });
}

template <class T>
void moe_unpermute_backward(T* dout, float* dw, const T* dy, const T* out, const int32_t* pos, const float* w,
                            int64_t n, int64_t k, int64_t d) {
  parallel_for(0, n, token_grain(k, d), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const T* g = dy + t * d;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t p = pos[t * k + j];
        const float wj = w[t * k + j];
        T* dst = dout + p * d;
        const T* o = out + p * d;
        float dot = 0;
        // Scalar math: dout[p] = w * dy[t]; dot += dy[t] * out[p] (one pass over dy for both)
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < d; ++c) {
          const float gc = to_f32(g[c]);
          dst[c] = from_f32<T>(wj * gc);
          dot += gc * to_f32(o[c]);
        }
        dw[t * k + j] += dot;
      }
    }
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
