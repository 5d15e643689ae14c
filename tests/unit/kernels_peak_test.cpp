// The AMX peak micro-kernel runs only where it may (rates are measured by bench_peak, never
// asserted: this machine is shared).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "titan/core/allocator.h"
#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/peak.h"
#include "titan/kernels/peak.h"

using namespace titan;

TEST(KernelsPeak, AmxKernelRunsOnlyWhereUsable) {
  std::printf("AMX bf16 usable: %s\n", cpu_amx_bf16_usable() ? "yes" : "no");
  if (cpu_amx_bf16_usable() && cpu_capability() == CpuCapability::avx512_bf16) {
    EXPECT_EQ(TITAN_CPU_KERNEL(peak_amx_bf16)(10), 10.0 * 4 * 16384);
  }
  EXPECT_EQ(kernels::cpu::avx2::peak_amx_bf16(10), 0.0);  // variants without AMX do nothing
}

// Benchmarks time the memcpy probe between repetitions of their kernels: it must hold its two
// 64 MiB buffers as accounted temporaries for its lifetime only, and report a real rate.
TEST(KernelsPeak, MemcpyProbeHoldsItsBuffersOnlyWhileAlive) {
  const auto temporaries = [] { return memory_stats().live[size_t(MemCategory::temporaries)]; };
  const int64_t before = temporaries();
  {
    kernels::MemcpyProbe probe;
    EXPECT_EQ(temporaries(), before + 2 * (int64_t(64) << 20));
    const double rate = probe.pass();
    EXPECT_TRUE(std::isfinite(rate));
    EXPECT_GT(rate, 0.0);
  }
  EXPECT_EQ(temporaries(), before);
}
