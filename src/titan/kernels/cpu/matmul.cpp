#include "titan/kernels/cpu/matmul.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

// Threads own disjoint column ranges, so each db[j] is summed over rows in order by one thread:
// the result does not depend on the thread count.
template <class T>
void linear_bias_backward(float* db, const T* dy, int64_t rows, int64_t cols) {
  // About 32K elements per chunk: below that, starting threads costs more than it saves.
  const int64_t per_chunk = (int64_t(1) << 15) / (rows > 0 ? rows : 1);
  const int64_t grain = per_chunk > 16 ? per_chunk : 16;
  parallel_for(0, cols, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = dy + r * cols;
      // Scalar math: db[j] += dy[r, j]
#pragma omp simd
      for (int64_t j = lo; j < hi; ++j) db[j] += to_f32(row[j]);
    }
  });
}

template void linear_bias_backward<float>(float*, const float*, int64_t, int64_t);
template void linear_bias_backward<bf16>(float*, const bf16*, int64_t, int64_t);

}  // namespace titan::kernels::cpu::TITAN_ISA
