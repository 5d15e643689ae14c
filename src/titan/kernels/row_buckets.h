// Rows of a scatter grouped by destination, so scatter-add kernels can give each destination row
// to one thread and sum its sources in a fixed order: race-free, and bit-identical for any
// thread count (resumed runs and different machines' thread pools agree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace titan::kernels {

// The plain view the kernels take: for bucket b, rows sources[starts[b] .. starts[b+1]) (in
// ascending order) all go to destination row dests[b]. Destinations are distinct and ascending.
struct RowBucketsView {
  const int32_t* dests = nullptr;    // [count]
  const int64_t* starts = nullptr;   // [count + 1]
  const int32_t* sources = nullptr;  // [M]
  int64_t count = 0;
};

struct RowBuckets {
  std::vector<int32_t> dests;
  std::vector<int64_t> starts;
  std::vector<int32_t> sources;
  RowBucketsView view() const { return {dests.data(), starts.data(), sources.data(), int64_t(dests.size())}; }
};

// Groups rows i in [0, M) by idx[i] (a stable counting sort, O(M + num_dests)). Every idx must be
// in [0, num_dests); callers validate indices first, with errors that name the bad one.
RowBuckets bucket_rows_by_index(const int32_t* idx, int64_t m, int64_t num_dests);

}  // namespace titan::kernels
