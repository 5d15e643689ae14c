// The measured machine peaks, in particular bf16 = max(AVX512_BF16 dot, AMX tiles).
#include <gtest/gtest.h>

#include <cstdio>

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

TEST(KernelsPeak, Bf16PeakIsAtLeastTheVectorRate) {
  const kernels::MachinePeak p = kernels::measure_machine_peak(0.05);
  std::printf("f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", p.f32_flops / 1e9, p.bf16_flops / 1e9);
  EXPECT_GT(p.f32_flops, 0);
  // Shared machines are noisy, so only the ordering with a wide margin is asserted.
  EXPECT_GT(p.bf16_flops, 0.5 * p.f32_flops);
}
