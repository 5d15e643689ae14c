#include "titan/kernels/ref/elementwise.h"

namespace titan::kernels::ref {

template <class T>
void add(T* y, const T* a, const T* b, acc_t<T> alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(a[i]) + alpha * load(b[i]));
}

template <class T>
void add_backward(T* da, T* db, const T* dy, acc_t<T> alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> g = load(dy[i]);
    if (da) da[i] = store<T>(load(da[i]) + g);
    if (db) db[i] = store<T>(load(db[i]) + alpha * g);
  }
}

template <class T>
void mul(T* y, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(load(a[i]) * load(b[i]));
}

template <class T>
void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const acc_t<T> g = load(dy[i]);
    if (da) da[i] = store<T>(load(da[i]) + g * load(b[i]));
    if (db) db[i] = store<T>(load(db[i]) + g * load(a[i]));
  }
}

template <class T>
void scale(T* y, const T* x, acc_t<T> alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(alpha * load(x[i]));
}

template <class T>
void axpby(T* y, const T* x, acc_t<T> alpha, acc_t<T> beta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(alpha * load(x[i]) + beta * load(y[i]));
}

#define TITAN_INSTANTIATE(T)                                                              \
  template void add<T>(T*, const T*, const T*, acc_t<T>, int64_t);                        \
  template void add_backward<T>(T*, T*, const T*, acc_t<T>, int64_t);                     \
  template void mul<T>(T*, const T*, const T*, int64_t);                                  \
  template void mul_backward<T>(T*, T*, const T*, const T*, const T*, int64_t);           \
  template void scale<T>(T*, const T*, acc_t<T>, int64_t);                                \
  template void axpby<T>(T*, const T*, acc_t<T>, acc_t<T>, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
