// How baseline code calls a per-ISA CPU kernel, and the switch between fast and reference kernels.
#pragma once

#include "titan/core/cpu_features.h"

// Declares the same kernels in every ISA namespace, e.g. in kernels/cpu/rmsnorm.h:
//   #define TITAN_RMSNORM_KERNELS template <class T> void rmsnorm_forward(T* y, ...);
//   TITAN_FOR_EACH_ISA(TITAN_RMSNORM_KERNELS)
#define TITAN_FOR_EACH_ISA(...)                  \
  namespace titan::kernels::cpu {                \
  namespace baseline { __VA_ARGS__ }             \
  namespace avx2 { __VA_ARGS__ }                 \
  namespace avx512_bf16 { __VA_ARGS__ }          \
  }

// The variant of kernel `name` (which may name a template instance) for the CPU in use.
#define TITAN_CPU_KERNEL(...)                                                                        \
  ::titan::kernels::pick_isa(&::titan::kernels::cpu::baseline::__VA_ARGS__,                         \
                             &::titan::kernels::cpu::avx2::__VA_ARGS__,                             \
                             &::titan::kernels::cpu::avx512_bf16::__VA_ARGS__)

namespace titan::kernels {

template <class Fn>
Fn pick_isa(Fn baseline, Fn avx2, Fn avx512_bf16) {
  switch (cpu_capability()) {
    case CpuCapability::avx512_bf16: return avx512_bf16;
    case CpuCapability::avx2: return avx2;
    case CpuCapability::baseline: break;
  }
  return baseline;
}

// Which implementation the Tensor-level kernel API runs: the fast CPU kernels (default) or the
// plain references in kernels/ref/ (TITAN_KERNELS=reference, for debugging and as the oracle).
enum class KernelBackend { fast, reference };
KernelBackend kernel_backend();
void set_kernel_backend(KernelBackend b);

}  // namespace titan::kernels
