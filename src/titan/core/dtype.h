// Element types and their conversions. Every narrowing conversion rounds to nearest, ties to even.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>

// Scalar helpers here are force-inlined: they are used inside kernels compiled once per
// instruction set, and an out-of-line copy could be shared between those variants by the linker.
#define TITAN_INLINE inline __attribute__((always_inline))

namespace titan {

enum class DType : uint8_t { f32, bf16, f16, f8e4m3, f8e5m2, f4e2m1, e8m0, i32, i64, u8 };
inline constexpr int kNumDTypes = 10;

// Bits per element (f4e2m1 packs two elements per byte, low nibble first).
constexpr int dtype_bits(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 32;
    case DType::i64: return 64;
    case DType::bf16: case DType::f16: return 16;
    case DType::f8e4m3: case DType::f8e5m2: case DType::e8m0: case DType::u8: return 8;
    case DType::f4e2m1: return 4;
  }
  return 0;
}
constexpr bool dtype_is_float(DType t) { return t != DType::i32 && t != DType::i64 && t != DType::u8; }
std::string_view dtype_name(DType t);  // "f32", "bf16", ... (also the names used in configs)
// Parses a dtype name; accepts ours and safetensors' ("F32", "BF16", "F8_E4M3", ...). Throws on unknown.
DType dtype_from_name(std::string_view name);

// ---- 16-bit and 8-bit float storage types ----------------------------------------------------
struct bf16 { uint16_t bits; };
struct f16 { uint16_t bits; };
struct f8e4m3 { uint8_t bits; };  // "fn" variant: no infinities, 0x7f/0xff are NaN, max 448
struct f8e5m2 { uint8_t bits; };  // IEEE-like: infinities and NaNs, max 57344
struct e8m0 { uint8_t bits; };    // a power of two 2^(bits-127); 0xff is NaN (MX block scale)

TITAN_INLINE float bf16_to_f32(bf16 v) { return std::bit_cast<float>(uint32_t(v.bits) << 16); }
TITAN_INLINE bf16 f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                               // round to nearest even
  return bf16{uint16_t(u >> 16)};
}

float f16_to_f32(f16 v);
f16 f32_to_f16(float f);
float f8e4m3_to_f32(f8e4m3 v);
f8e4m3 f32_to_f8e4m3(float f);  // saturates to +-448; NaN stays NaN
float f8e5m2_to_f32(f8e5m2 v);
f8e5m2 f32_to_f8e5m2(float f);  // overflow past the rounding threshold gives +-inf, as IEEE does
float e8m0_to_f32(e8m0 v);
e8m0 f32_to_e8m0(float f);      // nearest power of two in log space (ties up); 0 and negatives give 2^-127
float f4e2m1_to_f32(uint8_t nibble);  // values {0, .5, 1, 1.5, 2, 3, 4, 6} with a sign bit
uint8_t f32_to_f4e2m1(float f);       // saturates to +-6

// Converts n elements between any two dtypes (contiguous buffers). f4e2m1 buffers hold n/2 bytes
// (n must be even). Float-to-integer conversion rounds to nearest and saturates.
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

// Reads/writes one element as double (slow path for printing, tests and strided copies).
double load_as_double(const void* base, DType t, int64_t index);
void store_from_double(void* base, DType t, int64_t index, double v);

// C++ type -> DType, for typed accessors.
template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<f8e4m3> { static constexpr DType value = DType::f8e4m3; };
template <> struct dtype_of<f8e5m2> { static constexpr DType value = DType::f8e5m2; };
template <> struct dtype_of<e8m0> { static constexpr DType value = DType::e8m0; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };

}  // namespace titan
