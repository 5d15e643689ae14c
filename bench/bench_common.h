// Shared helpers for benchmarks: timing and printing ratios measured in one run.
#pragma once

#include <omp.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

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

// Best wall time of a memory-bound f and the best memcpy bandwidth (bytes/s), measured alternately
// over the same `reps` rounds so that both see the same state of the shared memory system.
struct BesideMemcpy {
  double seconds, memcpy_bytes;
};
inline BesideMemcpy time_best_beside_memcpy(const std::function<void()>& f, int reps = 10, int warmup = 2) {
  kernels::MemcpyProbe probe;
  for (int i = 0; i < warmup; ++i) f(), probe.pass();
  BesideMemcpy best{1e300, 0};
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_seconds();
    f();
    best.seconds = std::min(best.seconds, now_seconds() - t0);
    best.memcpy_bytes = std::max(best.memcpy_bytes, probe.pass());
  }
  return best;
}

inline void print_peak(const kernels::MachinePeak& p) {
  std::printf("measured peak: f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, memcpy %.1f GB/s (read+write)\n",
              p.f32_flops / 1e9, p.bf16_flops / 1e9, p.memcpy_bytes / 1e9);
}

// Under OMP_PROC_BIND, libgomp binds a process's initial thread to its first place (one core), and
// a child process inherits that mask: its whole OpenMP team would share the one core (until
// 2026-12-05 the scaling and training-step benchmarks' children ran on one thread that way). A
// child runs on the CPUs this process was started with instead (the union of OpenMP's places,
// which libgomp made from that mask, e.g. a taskset's); this thread's own binding is put back
// once the child exists, so the parent's timings keep theirs.
class ChildCpus {
 public:
  ChildCpus() {
    sched_getaffinity(0, sizeof saved_, &saved_);
    cpu_set_t wide;
    CPU_ZERO(&wide);
    for (int p = 0; p < omp_get_num_places(); ++p) {
      std::vector<int> ids(size_t(omp_get_place_num_procs(p)));
      omp_get_place_proc_ids(p, ids.data());
      for (int c : ids) CPU_SET(c, &wide);
    }
    if (CPU_COUNT(&wide) > 0 && sched_setaffinity(0, sizeof wide, &wide) != 0)
      std::fprintf(stderr, "bench: warning: cannot widen the CPUs for a child process: it may run on one core\n");
  }
  ~ChildCpus() { sched_setaffinity(0, sizeof saved_, &saved_); }
  ChildCpus(const ChildCpus&) = delete;
  ChildCpus& operator=(const ChildCpus&) = delete;

 private:
  cpu_set_t saved_;
};

// The output of a shell command (a benchmark's child process or its PyTorch twin), or "" when it
// could not run or exited with an error; it runs on the CPUs this process was started with.
inline std::string read_command(const std::string& cmd) {
  FILE* p = nullptr;
  {
    const ChildCpus cpus;  // the child takes the mask at its fork, inside popen
    p = popen(cmd.c_str(), "r");
  }
  if (!p) return {};
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  return pclose(p) == 0 ? out : std::string();
}

// This process's resident-memory high-water mark, comparable with what PyTorch scripts report.
inline int64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return int64_t(u.ru_maxrss) * 1024;
}

// "4096,8192" -> {4096, 8192} (a command-line list of lengths).
inline std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) v.push_back(std::atoll(item.c_str()));
  return v;
}

// "PASS"/"MISS" against a target, for the summary lines benchmarks print.
inline const char* verdict(double value, double target) { return value >= target ? "PASS" : "MISS"; }

}  // namespace titan::bench
