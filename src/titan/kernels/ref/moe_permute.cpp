#include "titan/kernels/ref/moe_permute.h"


namespace titan::kernels::ref {

template <class T>
void moe_permute_forward(T* xs, const T* x, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      for (int64_t c = 0; c < d; ++c) xs[int64_t(pos[t * k + j]) * d + c] = x[t * d + c];
}

template <class T>
void moe_permute_backward(T* dx, const T* dxs, const int32_t* pos, int64_t n, int64_t k, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      acc_t<T> s = load(dx[t * d + c]);
      for (int64_t j = 0; j < k; ++j) s += load(dxs[int64_t(pos[t * k + j]) * d + c]);
      dx[t * d + c] = store<T>(s);
    }
  }
}

template <class T>
void moe_unpermute_forward(T* y, const T* out, const int32_t* pos, const acc_t<T>* w, int64_t n, int64_t k,
                           int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t c = 0; c < d; ++c) {
      acc_t<T> s = 0;
      for (int64_t j = 0; j < k; ++j) s += w[t * k + j] * load(out[int64_t(pos[t * k + j]) * d + c]);
      y[t * d + c] = store<T>(s);
    }
  }
}

template <class T>
void moe_unpermute_backward(T* dout, acc_t<T>* dw, const T* dy, const T* out, const int32_t* pos, const acc_t<T>* w,
                            int64_t n, int64_t k, int64_t d) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = pos[t * k + j];
      acc_t<T> dot = 0;
      for (int64_t c = 0; c < d; ++c) {
        dout[p * d + c] = store<T>(w[t * k + j] * load(dy[t * d + c]));
        dot += load(dy[t * d + c]) * load(out[p * d + c]);
      }
      dw[t * k + j] += dot;
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                    \
  template void moe_permute_forward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);                \
  template void moe_permute_backward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t);               \
  template void moe_unpermute_forward<T>(T*, const T*, const int32_t*, const acc_t<T>*, int64_t, int64_t, int64_t); \
  template void moe_unpermute_backward<T>(T*, acc_t<T>*, const T*, const T*, const int32_t*, const acc_t<T>*,     \
                                          int64_t, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
