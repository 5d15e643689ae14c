#include "titan/kernels/ref/grouped_matmul.h"

namespace titan::kernels::ref {

template <class T>
void grouped_matmul_forward(T* c, const T* a, const T* w, const int64_t* offsets, int64_t experts, int64_t n,
                            int64_t k) {
  for (int64_t e = 0; e < experts; ++e) {
    const T* we = w + e * n * k;
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        acc_t<T> s = 0;
        for (int64_t l = 0; l < k; ++l) s += load(a[i * k + l]) * load(we[j * k + l]);
        c[i * n + j] = store<T>(s);
      }
    }
  }
}

template <class T>
void grouped_matmul_backward(T* da, acc_t<T>* dw, const T* dc, const T* a, const T* w, const int64_t* offsets,
                             int64_t experts, int64_t n, int64_t k) {
  for (int64_t e = 0; e < experts; ++e) {
    const T* we = w + e * n * k;
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      if (da) {
        for (int64_t l = 0; l < k; ++l) {
          acc_t<T> s = 0;
          for (int64_t j = 0; j < n; ++j) s += load(dc[i * n + j]) * load(we[j * k + l]);
          da[i * k + l] = store<T>(load(da[i * k + l]) + s);
        }
      }
    }
    if (dw) {
      // The token sum runs innermost, as one dot product per weight element (what a GEMM's
      // accumulator does), so bf16 inputs round once per element, not once per token.
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t l = 0; l < k; ++l) {
          acc_t<T> s = 0;
          for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) s += load(dc[i * n + j]) * load(a[i * k + l]);
          dw[(e * n + j) * k + l] += s;
        }
      }
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                      \
  template void grouped_matmul_forward<T>(T*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t);     \
  template void grouped_matmul_backward<T>(T*, acc_t<T>*, const T*, const T*, const T*, const int64_t*, int64_t, \
                                           int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
