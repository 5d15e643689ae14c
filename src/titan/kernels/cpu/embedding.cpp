#include "titan/kernels/cpu/embedding.h"

#include "titan/kernels/cpu/row_ops.h"

namespace titan::kernels::cpu::TITAN_ISA {

template <class T>
void embedding_forward(T* y, const float* table, const int32_t* ids, int64_t n, int64_t d) {
  const int64_t grain = (1 << 14) / (d + 1) + 1;  // ~64 KiB per chunk
  parallel_for(0, n, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) scale_row(y + i * d, table + int64_t(ids[i]) * d, 1.0f, d);
  });
}

template <class T>
void embedding_backward(float* dtable, const T* dy, const RowBucketsView& by_id, int64_t d) {
  scatter_add_rows_bucketed(dtable, dy, nullptr, by_id, d);
}

template void embedding_forward<float>(float*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_forward<bf16>(bf16*, const float*, const int32_t*, int64_t, int64_t);
template void embedding_backward<float>(float*, const float*, const RowBucketsView&, int64_t);
template void embedding_backward<bf16>(float*, const bf16*, const RowBucketsView&, int64_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
