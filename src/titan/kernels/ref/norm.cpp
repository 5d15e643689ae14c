#include "titan/kernels/ref/norm.h"

#include <cmath>

namespace titan::kernels::ref {

template <class T>
void rmsnorm_forward(T* y, acc_t<T>* rstd, const T* x, const acc_t<T>* w, int64_t N, int64_t D, acc_t<T> eps) {
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * D;  // [D]
    T* yi = y + i * D;        // [D]
    acc_t<T> ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += load(xi[j]) * load(xi[j]);
    const acc_t<T> r = 1 / std::sqrt(ss / acc_t<T>(D) + eps);
    rstd[i] = r;
    for (int64_t j = 0; j < D; ++j) yi[j] = store<T>(load(xi[j]) * r * w[j]);
  }
}

template <class T>
void rmsnorm_backward(T* dx, acc_t<T>* dw, const acc_t<T>* rstd, const T* dy, const T* x, const acc_t<T>* w,
                      int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * D;    // [D]
    const T* dyi = dy + i * D;  // [D]
    T* dxi = dx + i * D;        // [D]
    const acc_t<T> r = rstd[i];
    acc_t<T> dot = 0;
    for (int64_t j = 0; j < D; ++j) dot += load(dyi[j]) * w[j] * load(xi[j]);
    const acc_t<T> c = dot * r * r * r / acc_t<T>(D);
    for (int64_t j = 0; j < D; ++j) {
      dxi[j] = store<T>(load(dxi[j]) + r * w[j] * load(dyi[j]) - c * load(xi[j]));
      if (dw) dw[j] += load(dyi[j]) * load(xi[j]) * r;
    }
  }
}

template <class T>
void layernorm_forward(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const acc_t<T>* w, const acc_t<T>* b,
                       int64_t N, int64_t D, acc_t<T> eps) {
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * D;  // [D]
    T* yi = y + i * D;        // [D]
    acc_t<T> s = 0;
    for (int64_t j = 0; j < D; ++j) s += load(xi[j]);
    const acc_t<T> mu = s / acc_t<T>(D);
    // Variance from deviations (two passes), not E[x^2] - mu^2, which cancels when |mu| >> std.
    acc_t<T> ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += (load(xi[j]) - mu) * (load(xi[j]) - mu);
    const acc_t<T> r = 1 / std::sqrt(ss / acc_t<T>(D) + eps);
    mean[i] = mu;
    rstd[i] = r;
    for (int64_t j = 0; j < D; ++j) yi[j] = store<T>((load(xi[j]) - mu) * r * w[j] + b[j]);
  }
}

template <class T>
void layernorm_backward(T* dx, acc_t<T>* dw, acc_t<T>* db, const acc_t<T>* mean, const acc_t<T>* rstd, const T* dy,
                        const T* x, const acc_t<T>* w, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * D;    // [D]
    const T* dyi = dy + i * D;  // [D]
    T* dxi = dx + i * D;        // [D]
    const acc_t<T> mu = mean[i], r = rstd[i];
    acc_t<T> sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < D; ++j) {
      const acc_t<T> g = load(dyi[j]) * w[j], xhat = (load(xi[j]) - mu) * r;
      sum_g += g;
      sum_gx += g * xhat;
    }
    const acc_t<T> mean_g = sum_g / acc_t<T>(D), mean_gx = sum_gx / acc_t<T>(D);
    for (int64_t j = 0; j < D; ++j) {
      const acc_t<T> g = load(dyi[j]) * w[j], xhat = (load(xi[j]) - mu) * r;
      dxi[j] = store<T>(load(dxi[j]) + r * (g - mean_g - xhat * mean_gx));
      if (dw) dw[j] += load(dyi[j]) * xhat;
      if (db) db[j] += load(dyi[j]);
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                       \
  template void rmsnorm_forward<T>(T*, acc_t<T>*, const T*, const acc_t<T>*, int64_t, int64_t, acc_t<T>);          \
  template void rmsnorm_backward<T>(T*, acc_t<T>*, const acc_t<T>*, const T*, const T*, const acc_t<T>*, int64_t, \
                                    int64_t);                                                                      \
  template void layernorm_forward<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const acc_t<T>*, const acc_t<T>*,        \
                                     int64_t, int64_t, acc_t<T>);                                                  \
  template void layernorm_backward<T>(T*, acc_t<T>*, acc_t<T>*, const acc_t<T>*, const acc_t<T>*, const T*,       \
                                      const T*, const acc_t<T>*, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
