#include "titan/core/clock.h"
#include "titan/kernels/peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "titan/core/allocator.h"
#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/peak.h"

namespace titan::kernels {
namespace {


// Best rate of `kernel` over many short rounds (10-20 ms, or seconds/20 if shorter), all threads
// running it at once. Short rounds matter on a shared machine: the best round is one where no
// other process took a core, and such quiet moments are short.
template <class Kernel>
double best_rate(Kernel kernel, double seconds) {
  int64_t iters = 1 << 16;
  double best = 0;
  const double deadline = steady_seconds() + seconds;
  while (steady_seconds() < deadline) {
    double work = 0;
    const double t0 = steady_seconds();
#pragma omp parallel reduction(+ : work)
    work += kernel(iters);
    const double dt = steady_seconds() - t0;
    best = std::max(best, work / dt);
    if (dt < std::min(seconds / 20, 0.01)) iters *= 2;
  }
  return best;
}

double memcpy_rate(double seconds) {
  MemcpyProbe probe;
  double best = 0;
  const double deadline = steady_seconds() + seconds;
  do {
    best = std::max(best, probe.pass());
  } while (steady_seconds() < deadline);
  return best;
}

}  // namespace

MemcpyProbe::MemcpyProbe()
    : bytes_(size_t(64) << 20),
      src_(static_cast<char*>(memory_alloc(bytes_, MemCategory::temporaries))),
      dst_(static_cast<char*>(memory_alloc(bytes_, MemCategory::temporaries))) {
  std::memset(src_, 1, bytes_);
  std::memset(dst_, 2, bytes_);
}

MemcpyProbe::~MemcpyProbe() {
  memory_free(src_, bytes_, MemCategory::temporaries);
  memory_free(dst_, bytes_, MemCategory::temporaries);
}

double MemcpyProbe::pass() {
  const double t0 = steady_seconds();
#pragma omp parallel
  {
    const size_t nt = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
    const size_t lo = bytes_ * t / nt, hi = bytes_ * (t + 1) / nt;
    std::memcpy(dst_ + lo, src_ + lo, hi - lo);
  }
  return 2.0 * double(bytes_) / (steady_seconds() - t0);
}

MachinePeak measure_machine_peak(double seconds) {
  static std::mutex mu;
  static std::map<int, MachinePeak> cache;
  std::lock_guard lock(mu);
  const int threads = omp_get_max_threads();
  if (auto it = cache.find(threads); it != cache.end()) return it->second;
  MachinePeak p;
  // Threads started and cores at speed before anything counts.
  best_rate(TITAN_CPU_KERNEL(peak_fma_f32), std::min(seconds, 0.1));
  p.f32_flops = best_rate(TITAN_CPU_KERNEL(peak_fma_f32), seconds);
  p.bf16_flops = best_rate(TITAN_CPU_KERNEL(peak_dot_bf16), seconds);
  // AMX tiles, where usable, outrun the vector units on bf16 by far, and oneDNN's bf16 GEMMs use
  // them: the honest denominator for bf16 MFU is the faster of the two.
  if (cpu_capability() == CpuCapability::avx512_bf16 && cpu_amx_bf16_usable())
    p.bf16_flops = std::max(p.bf16_flops, best_rate(TITAN_CPU_KERNEL(peak_amx_bf16), seconds));
  p.memcpy_bytes = memcpy_rate(seconds);
  cache[threads] = p;
  return p;
}

}  // namespace titan::kernels
