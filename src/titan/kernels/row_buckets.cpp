#include "titan/kernels/row_buckets.h"

namespace titan::kernels {

RowBuckets bucket_rows_by_index(const int32_t* idx, int64_t m, int64_t num_dests) {
  std::vector<int64_t> next(static_cast<size_t>(num_dests) + 1, 0);  // count, then first free slot
  for (int64_t i = 0; i < m; ++i) ++next[size_t(idx[i]) + 1];
  RowBuckets b;
  for (int64_t d = 0; d < num_dests; ++d) {
    if (next[size_t(d) + 1] > 0) b.dests.push_back(int32_t(d));
    next[size_t(d) + 1] += next[size_t(d)];
  }
  for (int32_t d : b.dests) b.starts.push_back(next[size_t(d)]);
  b.starts.push_back(m);
  b.sources.resize(size_t(m));
  for (int64_t i = 0; i < m; ++i) b.sources[size_t(next[size_t(idx[i])]++)] = int32_t(i);
  return b;
}

}  // namespace titan::kernels
