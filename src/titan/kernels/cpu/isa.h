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
#include <type_traits>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

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

// One native vector of floats as a GCC vector type: 16 lanes (zmm) with AVX-512, 8 (ymm) with
// AVX2, 4 (xmm) on the baseline. (A generic vector wider than the ISA's is split by GCC and parts
// of its arithmetic scalarized.) `acc += a * b` contracts into FMA where the ISA has one.
// aligned(4) and may_alias: loads from any float address in our buffers. Register-tiled kernels
// (cpu/tile_gemm.h) size their tiles (rows x vectors) from kVecLanes and the register file.
#if defined(__AVX512F__)
constexpr int64_t kVecLanes = 16;
#elif defined(__AVX2__)
constexpr int64_t kVecLanes = 8;
#else
constexpr int64_t kVecLanes = 4;
#endif
// The avx512_bf16 variant: row kernels use the hand-written AVX-512 paths of cpu/avx512.h.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512BF16__)
#define TITAN_AVX512_ROWS 1
#endif

// Everything taking or returning vecf is force-inlined and never crosses a call boundary, so
// the warning that its ABI differs between ISA levels does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float vecf __attribute__((vector_size(sizeof(float) * kVecLanes), aligned(4), may_alias));

TITAN_INLINE vecf splat(float x) { return vecf{} + x; }
TITAN_INLINE vecf loadv(const float* p) { return *reinterpret_cast<const vecf*>(p); }
TITAN_INLINE void storev(float* p, vecf x) { *reinterpret_cast<vecf*>(p) = x; }

TITAN_INLINE int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }
TITAN_INLINE int64_t max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
// n rounded up to a multiple of m (n >= 0, m > 0).
TITAN_INLINE int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Packed rows of the micro-kernels are padded to a multiple of kPadLanes floats: whole vectors at
// every ISA level.
inline constexpr int64_t kPadLanes = 16;

// exp(x) for float, vectorizable under `#pragma omp simd` (libm's expf is not). Cody-Waite range
// reduction to [-ln2/2, ln2/2] and a degree-6 polynomial: max relative error ~4 ulp (against a
// double-precision exp) on the normal range; x < -87.68 gives 0 (never a subnormal), x > 88.37
// gives +inf, NaN stays NaN.
//
// Written so GCC 12 vectorizes it at every ISA level: |x| is clamped with integer operations on
// its bits (a float compare-and-select is not if-converted under the default -ftrapping-math
// once its result feeds more arithmetic), and n is rounded to nearest even by adding and
// subtracting 1.5 * 2^23 (exact for |n| < 2^22; __builtin_roundevenf does not vectorize).
TITAN_INLINE float fast_exp(float x) {
  constexpr uint32_t kLimit = 0x42b17217u;  // 88.72283f: exp overflows above, underflows below -kLimit
  const uint32_t bits = __builtin_bit_cast(uint32_t, x), magnitude = bits & 0x7fffffffu;
  const bool clamp = magnitude > kLimit && magnitude <= 0x7f800000u;  // finite or inf beyond the limit; not NaN
  x = __builtin_bit_cast(float, clamp ? (bits & 0x80000000u) | kLimit : bits);
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
  // 2^n as float bits; n <= -127 gives 0 and n >= 128 gives inf (exponent field 0 or 255).
  int32_t e = int32_t(n) + 127;
  e = e < 0 ? 0 : e;
  e = e > 255 ? 255 : e;
  return p * __builtin_bit_cast(float, uint32_t(e) << 23);
}

}  // namespace titan::kernels::cpu::TITAN_ISA
