#include "titan/core/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <omp.h>
#include <xmmintrin.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "titan/core/error.h"

namespace titan {
namespace {

CpuCapability detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bf16"))
    return CpuCapability::avx512_bf16;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
      __builtin_cpu_supports("bmi2"))
    return CpuCapability::avx2;
  return CpuCapability::baseline;
}

std::atomic<int>& current() {
  static std::atomic<int> level = [] {
    const CpuCapability best = detect();
    CpuCapability chosen = best;
    if (const char* env = std::getenv("TITAN_CPU_CAPABILITY"); env && *env) {
      chosen = cpu_capability_from_name(env);
      TITAN_CHECK(int(chosen) <= int(best),
                  "TITAN_CPU_CAPABILITY=" + std::string(env) + " but this CPU supports at most " +
                      std::string(cpu_capability_name(best)),
                  "unset TITAN_CPU_CAPABILITY or pick a lower level");
    }
    return int(chosen);
  }();
  return level;
}

}  // namespace

CpuCapability cpu_capability() { return CpuCapability(current().load(std::memory_order_relaxed)); }
CpuCapability cpu_capability_detected() {
  static const CpuCapability best = detect();
  return best;
}

void set_cpu_capability(CpuCapability c) {
  TITAN_CHECK(int(c) <= int(cpu_capability_detected()),
              "this CPU does not support " + std::string(cpu_capability_name(c)));
  current().store(int(c));
}

bool cpu_amx_switch(std::string_view value) {
  TITAN_CHECK(value.empty() || value == "0" || value == "1",
              "environment variable TITAN_AMX=" + std::string(value) + " is not 0 or 1",
              "set TITAN_AMX=0 to keep the bf16 kernels off AMX tiles, or unset it");
  return value != "0";
}

namespace {
std::atomic<bool>& amx_enabled() {
  static std::atomic<bool> on = [] {
    const char* env = std::getenv("TITAN_AMX");
    return cpu_amx_switch(env ? env : "");
  }();
  return on;
}
}  // namespace

void set_cpu_amx_enabled(bool on) { amx_enabled().store(on); }

bool cpu_amx_bf16_usable() { return amx_enabled().load(std::memory_order_relaxed) && cpu_amx_bf16_detected(); }

bool cpu_amx_bf16_detected() {
  static const bool usable = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool amx_bf16 = edx & (1u << 22), amx_tile = edx & (1u << 24);
    if (!amx_bf16 || !amx_tile) return false;
    uint32_t xcr0_lo, xcr0_hi;
    asm volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    const uint32_t tile_state = (1u << 17) | (1u << 18);  // XTILECFG, XTILEDATA
    if ((xcr0_lo & tile_state) != tile_state) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return usable;
}

std::string_view cpu_capability_name(CpuCapability c) {
  switch (c) {
    case CpuCapability::baseline: return "baseline";
    case CpuCapability::avx2: return "avx2";
    case CpuCapability::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

CpuCapability cpu_capability_from_name(std::string_view name) {
  for (int i = 0; i <= 2; ++i)
    if (cpu_capability_name(CpuCapability(i)) == name) return CpuCapability(i);
  TITAN_FAIL("unknown CPU capability '" + std::string(name) + "'", "use baseline, avx2 or avx512_bf16");
}

bool flush_denormals(bool on) {
  constexpr unsigned kFtzDaz = 0x8040;  // MXCSR bits 15 (flush to zero) and 6 (denormals are zero)
  const bool was = (_mm_getcsr() & kFtzDaz) == kFtzDaz;
  auto set = [on] { _mm_setcsr(on ? (_mm_getcsr() | kFtzDaz) : (_mm_getcsr() & ~kFtzDaz)); };
  set();
#pragma omp parallel
  set();
  return was;
}

}  // namespace titan
