// Included first by every file in kernels/cpu/. Each of those files is compiled once per
// instruction-set level (CMakeLists.txt: baseline, avx2, avx512_bf16) with TITAN_ISA set to the
// level's name, and puts its kernels in namespace titan::kernels::cpu::TITAN_ISA. The
// baseline-compiled code in kernels/<family>.cpp picks one variant at run time
// (TITAN_CPU_KERNEL below), so one binary runs on any x86-64 CPU.
//
// Rule for these files: use only the helpers in this header (they live in the per-ISA
// namespace) and force-inlined scalar helpers from core/dtype.h. An ordinary inline function or
// template from a shared header would be compiled with AVX-512 in one variant, and the linker
// may keep that copy for every caller, which breaks older CPUs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "titan/core/dtype.h"

#ifndef TITAN_ISA
#error "kernels/cpu/ files are compiled once per ISA level with -DTITAN_ISA=<level>"
#endif

namespace titan::kernels::cpu::TITAN_ISA {

TITAN_INLINE float to_f32(float v) { return v; }
TITAN_INLINE float to_f32(bf16 v) { return bf16_to_f32(v); }
template <class T> TITAN_INLINE T from_f32(float v);
template <> TITAN_INLINE float from_f32<float>(float v) { return v; }
template <> TITAN_INLINE bf16 from_f32<bf16>(float v) { return f32_to_bf16(v); }

// exp(x) for float, vectorizable under `#pragma omp simd` (libm's expf is not). Cody-Waite range
// reduction to [-ln2/2, ln2/2] and a degree-6 polynomial: max relative error ~2 ulp on the
// normal range; x < -87.3 gives 0 and x > 88.37 gives +inf.
TITAN_INLINE float fast_exp(float x) {
  x = x < -87.33654f ? -87.33654f - 1.0f : x;  // below this the result underflows to 0 below
  x = x > 88.72283f ? 88.72283f : x;
  // Round to nearest even by adding and removing 1.5 * 2^23 (exact for |v| < 2^22; here |v| < 128).
  // Not __builtin_roundevenf: g++ 12 cannot vectorize it, which left every caller scalar.
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.428606765330187e-06f;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = int32_t(n) + 127;
  const float scale = e <= 0 ? 0.0f : __builtin_bit_cast(float, uint32_t(e < 255 ? e : 255) << 23);
  return p * scale;
}

}  // namespace titan::kernels::cpu::TITAN_ISA
