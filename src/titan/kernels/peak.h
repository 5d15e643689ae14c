// This machine's measured peaks: FLOP/s (f32 FMA, bf16 dot) on all threads, and memcpy bandwidth.
// Measured, not assumed, so MFU and benchmark ratios stay honest on any CPU.
#pragma once

#include <cstddef>

namespace titan::kernels {

struct MachinePeak {
  double f32_flops = 0;     // FLOP/s, all threads
  // FLOP/s, all threads: the faster of AVX512_BF16 dot products and AMX bf16 tiles (AMX only
  // where the CPU has it and the OS grants tile use); equals f32 without AVX512_BF16.
  double bf16_flops = 0;
  double memcpy_bytes = 0;  // bytes/s moved (read + write counted once each, i.e. 2x the copy size)
};

// Runs the micro-kernels for about `seconds` each (best of several rounds). Cached after the
// first call with the same thread count.
MachinePeak measure_machine_peak(double seconds = 0.2);

// The memcpy bandwidth probe on its own: each pass() copies 64 MiB (far past the last-level
// cache) on all threads and returns bytes/s moved (read + write). A shared VM's memory bandwidth
// drifts by 2x over minutes, so a benchmark of a memory-bound kernel times passes between its own
// repetitions and compares the two measured side by side.
class MemcpyProbe {
 public:
  MemcpyProbe();
  ~MemcpyProbe();
  MemcpyProbe(const MemcpyProbe&) = delete;
  MemcpyProbe& operator=(const MemcpyProbe&) = delete;
  double pass();

 private:
  std::size_t bytes_;
  char* src_;
  char* dst_;
};

}  // namespace titan::kernels
