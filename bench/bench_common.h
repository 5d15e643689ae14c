// Shared helpers for benchmarks: timing and printing ratios measured in one run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "titan/kernels/peak.h"

namespace titan::bench {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best wall time of f over `reps` runs after `warmup` runs (best, not mean: the VM is shared).
inline double time_best(const std::function<void()>& f, int reps = 10, int warmup = 2) {
  for (int i = 0; i < warmup; ++i) f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    f();
    best = std::min(best, now_seconds() - t0);
  }
  return best;
}

inline void print_peak(const kernels::MachinePeak& p) {
  std::printf("measured peak: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, memcpy %.1f GB/s (read+write)\n",
              p.f32_flops / 1e9, p.bf16_flops / 1e9, p.memcpy_bytes / 1e9);
}

// "PASS"/"MISS" against a target, for the summary lines benchmarks print.
inline const char* verdict(double value, double target) { return value >= target ? "PASS" : "MISS"; }

}  // namespace titan::bench
