#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "titan/core/cpu_features.h"
#include "titan/core/error.h"
#include "titan/kernels/cpu/isa_info.h"

using namespace titan;

// Shows which ISA variant the kernels use on this machine, and that each lower level can be
// selected and actually runs its own compiled variant.
TEST(CpuDispatch, PicksTheBestSupportedVariant) {
  const CpuCapability best = cpu_capability_detected();
  std::printf("detected CPU capability: %s; kernels run the %s variant\n",
              std::string(cpu_capability_name(best)).c_str(), TITAN_CPU_KERNEL(isa_variant_name)());
  if (std::getenv("TITAN_CPU_CAPABILITY") == nullptr) {
    EXPECT_EQ(cpu_capability(), best);
  }
  __builtin_cpu_init();
  const bool has_bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
  EXPECT_EQ(best == CpuCapability::avx512_bf16, has_bf16);
  for (int level = 0; level <= int(best); ++level) {
    set_cpu_capability(CpuCapability(level));
    EXPECT_STREQ(TITAN_CPU_KERNEL(isa_variant_name)(), cpu_capability_name(CpuCapability(level)).data());
  }
  if (best != CpuCapability::avx512_bf16) {
    EXPECT_THROW(set_cpu_capability(CpuCapability::avx512_bf16), Error);
  }
  set_cpu_capability(best);
}

// TITAN_AMX takes 0 or 1 (or nothing); a typo such as "off" is an error naming the variable, not
// a silent "on". The switch turns cpu_amx_bf16_usable() off and back to what the CPU allows.
TEST(CpuDispatch, AmxSwitch) {
  EXPECT_TRUE(cpu_amx_switch(""));
  EXPECT_TRUE(cpu_amx_switch("1"));
  EXPECT_FALSE(cpu_amx_switch("0"));
  try {
    cpu_amx_switch("off");
    ADD_FAILURE() << "TITAN_AMX=off was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("TITAN_AMX=off"), std::string::npos) << e.what();
  }
  if (std::getenv("TITAN_AMX") == nullptr) {
    EXPECT_EQ(cpu_amx_bf16_usable(), cpu_amx_bf16_detected());
  }
  set_cpu_amx_enabled(false);
  EXPECT_FALSE(cpu_amx_bf16_usable());
  set_cpu_amx_enabled(true);
  EXPECT_EQ(cpu_amx_bf16_usable(), cpu_amx_bf16_detected());
}

// flush_denormals(true) makes f32 denormals (inputs and results) zero on this thread and on the
// OpenMP workers, where the kernels run; false restores IEEE gradual underflow.
TEST(CpuDispatch, FlushDenormalsReachesEveryThread) {
  volatile float tiny = 1e-30f;  // volatile: computed at run time, under the MXCSR in force
  auto product = [&] { return tiny * 1e-10f; };  // 1e-40: denormal
  const bool was = flush_denormals(false);
  EXPECT_GT(product(), 0.0f);
  flush_denormals(true);
  EXPECT_EQ(product(), 0.0f);
  int nonzero = 0;
#pragma omp parallel reduction(+ : nonzero)
  nonzero += product() != 0.0f;
  EXPECT_EQ(nonzero, 0);
  EXPECT_TRUE(flush_denormals(false));
  EXPECT_GT(product(), 0.0f);
  flush_denormals(was);
}
