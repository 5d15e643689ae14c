#include "titan/kernels/ref/reduce.h"

namespace titan::kernels::ref {

template <class T>
void sum_rows(T* y, const T* x, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    acc_t<T> s = 0;
    for (int64_t j = 0; j < D; ++j) s += load(x[i * D + j]);
    y[i] = store<T>(s);
  }
}

template <class T>
void mean_rows(T* y, const T* x, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    acc_t<T> s = 0;
    for (int64_t j = 0; j < D; ++j) s += load(x[i * D + j]);
    y[i] = store<T>(s / acc_t<T>(D));
  }
}

template <class T>
void sum_rows_backward(T* dx, const T* dy, acc_t<T> scale, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    const acc_t<T> g = scale * load(dy[i]);
    for (int64_t j = 0; j < D; ++j) dx[i * D + j] = store<T>(load(dx[i * D + j]) + g);
  }
}

template <class T>
void max_rows(T* y, int32_t* argmax, const T* x, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    int64_t best = 0;
    for (int64_t j = 1; j < D; ++j)
      if (load(x[i * D + j]) > load(x[i * D + best])) best = j;
    y[i] = x[i * D + best];
    argmax[i] = int32_t(best);
  }
}

template <class T>
void max_rows_backward(T* dx, const int32_t* argmax, const T* dy, int64_t N, int64_t D) {
  for (int64_t i = 0; i < N; ++i) {
    T& g = dx[i * D + argmax[i]];
    g = store<T>(load(g) + load(dy[i]));
  }
}

template <class T>
double sum_all(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(load(x[i]));
  return s;
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(load(x[i])) * double(load(x[i]));
  return s;
}

#define TITAN_INSTANTIATE(T)                                                             \
  template void sum_rows<T>(T*, const T*, int64_t, int64_t);                             \
  template void mean_rows<T>(T*, const T*, int64_t, int64_t);                            \
  template void sum_rows_backward<T>(T*, const T*, acc_t<T>, int64_t, int64_t);          \
  template void max_rows<T>(T*, int32_t*, const T*, int64_t, int64_t);                   \
  template void max_rows_backward<T>(T*, const int32_t*, const T*, int64_t, int64_t);    \
  template double sum_all<T>(const T*, int64_t);                                         \
  template double sum_squares<T>(const T*, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
