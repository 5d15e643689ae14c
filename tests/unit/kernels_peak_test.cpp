// The AMX peak micro-kernel runs only where it may (rates are measured by bench_peak, never
// asserted: this machine is shared).
#include <gtest/gtest.h>

#include <cstdio>

#include "titan/core/cpu_features.h"
#include "titan/kernels/cpu/peak.h"

using namespace titan;

TEST(KernelsPeak, AmxKernelRunsOnlyWhereUsable) {
  std::printf("AMX bf16 usable: %s\n", cpu_amx_bf16_usable() ? "yes" : "no");
  if (cpu_amx_bf16_usable() && cpu_capability() == CpuCapability::avx512_bf16) {
    EXPECT_EQ(TITAN_CPU_KERNEL(peak_amx_bf16)(10), 10.0 * 4 * 16384);
  }
  EXPECT_EQ(kernels::cpu::avx2::peak_amx_bf16(10), 0.0);  // variants without AMX do nothing
}
