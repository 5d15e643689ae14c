#include "titan/kernels/ref/gather.h"

#include <vector>

namespace titan::kernels::ref {

namespace {
// y[idx[i]] += w[i] * x[i] with per-destination f32 sums and one rounding per element.
template <class T>
void scatter_add(T* y, const T* x, const int32_t* idx, const acc_t<T>* w, int64_t r, int64_t m, int64_t d) {
  using A = acc_t<T>;
  std::vector<A> acc(size_t(r * d));
  for (int64_t k = 0; k < r * d; ++k) acc[size_t(k)] = load(y[k]);
  for (int64_t i = 0; i < m; ++i) {
    const A wi = w ? w[i] : A(1);
    for (int64_t j = 0; j < d; ++j) acc[size_t(int64_t(idx[i]) * d + j)] += wi * load(x[i * d + j]);
  }
  for (int64_t k = 0; k < r * d; ++k) y[k] = store<T>(acc[size_t(k)]);
}

template <class T>
acc_t<T> dot(const T* a, const T* b, int64_t d) {
  acc_t<T> s = 0;
  for (int64_t j = 0; j < d; ++j) s += load(a[j]) * load(b[j]);
  return s;
}
}  // namespace

template <class T>
void gather_rows_forward(T* y, const T* x, const int32_t* idx, const acc_t<T>* w, int64_t m, int64_t d) {
  for (int64_t i = 0; i < m; ++i) {
    const acc_t<T> wi = w ? w[i] : acc_t<T>(1);
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = store<T>(wi * load(x[int64_t(idx[i]) * d + j]));
  }
}

template <class T>
void gather_rows_backward(T* dx, acc_t<T>* dw, const T* dy, const T* x, const int32_t* idx, const acc_t<T>* w,
                          int64_t r, int64_t m, int64_t d) {
  if (dx) scatter_add(dx, dy, idx, w, r, m, d);
  if (dw) {
    for (int64_t i = 0; i < m; ++i) dw[i] += dot(dy + i * d, x + int64_t(idx[i]) * d, d);
  }
}

template <class T>
void scatter_add_rows_forward(T* y, const T* x, const int32_t* idx, const acc_t<T>* w, int64_t r, int64_t m,
                              int64_t d) {
  scatter_add(y, x, idx, w, r, m, d);
}

template <class T>
void scatter_add_rows_backward(T* dx, acc_t<T>* dw, const T* dy, const T* x, const int32_t* idx, const acc_t<T>* w,
                               int64_t m, int64_t d) {
  for (int64_t i = 0; i < m; ++i) {
    const T* g = dy + int64_t(idx[i]) * d;
    if (dx) {
      const acc_t<T> wi = w ? w[i] : acc_t<T>(1);
      for (int64_t j = 0; j < d; ++j) dx[i * d + j] = store<T>(load(dx[i * d + j]) + wi * load(g[j]));
    }
    if (dw) dw[i] += dot(g, x + i * d, d);
  }
}

#define TITAN_INSTANTIATE(T)                                                                                      \
  template void gather_rows_forward<T>(T*, const T*, const int32_t*, const acc_t<T>*, int64_t, int64_t);          \
  template void gather_rows_backward<T>(T*, acc_t<T>*, const T*, const T*, const int32_t*, const acc_t<T>*, int64_t, \
                                        int64_t, int64_t);                                                        \
  template void scatter_add_rows_forward<T>(T*, const T*, const int32_t*, const acc_t<T>*, int64_t, int64_t, int64_t); \
  template void scatter_add_rows_backward<T>(T*, acc_t<T>*, const T*, const T*, const int32_t*, const acc_t<T>*,    \
                                             int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
