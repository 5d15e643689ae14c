#include "titan/kernels/ref/embedding.h"

namespace titan::kernels::ref {

template <class T>
void embedding_forward(T* y, const acc_t<T>* table, const int32_t* ids, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) y[i * d + j] = store<T>(table[int64_t(ids[i]) * d + j]);
  }
}

template <class T>
void embedding_backward(acc_t<T>* dtable, const T* dy, const int32_t* ids, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < d; ++j) dtable[int64_t(ids[i]) * d + j] += load(dy[i * d + j]);
  }
}

#define TITAN_INSTANTIATE(T)                                                                         \
  template void embedding_forward<T>(T*, const acc_t<T>*, const int32_t*, int64_t, int64_t);         \
  template void embedding_backward<T>(acc_t<T>*, const T*, const int32_t*, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
