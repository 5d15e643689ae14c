// The one thread pool: OpenMP (oneDNN runs on the same runtime). Never nest parallel regions.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace titan {

inline int num_threads() { return omp_get_max_threads(); }

// Splits [begin, end) into at most num_threads() contiguous chunks of at least `grain` items and
// calls f(chunk_begin, chunk_end) on each, in parallel. Runs inline when already inside a
// parallel region or when the range is small.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const int64_t max_chunks = std::max<int64_t>(1, n / std::max<int64_t>(grain, 1));
  const int threads = int(std::min<int64_t>(omp_get_max_threads(), max_chunks));
  if (threads <= 1 || omp_in_parallel()) {
    f(begin, end);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = begin + n * t / nt, hi = begin + n * (t + 1) / nt;
    if (lo < hi) f(lo, hi);
  }
}

}  // namespace titan
