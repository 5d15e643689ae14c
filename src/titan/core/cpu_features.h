// Which instruction-set level the CPU kernels run at. Detected once; the environment variable
// TITAN_CPU_CAPABILITY (baseline | avx2 | avx512_bf16) or set_cpu_capability() can lower it,
// which is how tests run every level on one machine.
#pragma once

#include <string_view>

namespace titan {

enum class CpuCapability : int { baseline = 0, avx2 = 1, avx512_bf16 = 2 };

CpuCapability cpu_capability();           // the level in use
CpuCapability cpu_capability_detected();  // the best level this CPU supports
void set_cpu_capability(CpuCapability c); // throws if the CPU does not support c
std::string_view cpu_capability_name(CpuCapability c);
CpuCapability cpu_capability_from_name(std::string_view name);  // throws on unknown names

// Whether AMX bf16 tiles (TDPBF16PS) can run in this process: the CPU reports AMX-TILE and
// AMX-BF16, the OS enables the tile state, and Linux grants this process tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM; without it the first tile instruction raises SIGILL).
// Checked and requested once; false on any failure, and false while AMX is switched off
// (TITAN_AMX=0 in the environment, or set_cpu_amx_enabled(false): how tests and benchmarks run
// the AVX512-BF16 kernels that CPUs without AMX use). Independent of cpu_capability().
bool cpu_amx_bf16_usable();
bool cpu_amx_bf16_detected();        // the hardware / OS half of the above, ignoring the switch
void set_cpu_amx_enabled(bool on);   // the switch; on by default
// The switch's setting for a TITAN_AMX value: "" or "1" on, "0" off; anything else throws an
// error naming the variable.
bool cpu_amx_switch(std::string_view value);

// Flush-to-zero and denormals-are-zero (MXCSR FTZ | DAZ) on the calling thread and on every
// OpenMP worker. Training sets it: as attention sharpens, probabilities like exp(s - lse) fall
// into the f32 denormal range (below 1.2e-38), and every multiply-add touching one takes a
// microcode assist of ~100 cycles; the values are far below what f32 training resolves anyway.
// Returns whether the previous state had them on (for tests to restore).
bool flush_denormals(bool on);

}  // namespace titan
