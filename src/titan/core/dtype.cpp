#include "titan/core/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "titan/core/error.h"

namespace titan {

namespace {

constexpr std::string_view kNames[kNumDTypes] = {"f32", "bf16", "f16", "f8e4m3", "f8e5m2",
                                                 "f4e2m1", "e8m0", "i32", "i64", "u8"};

// A small binary float format: sign bit, `ebits` exponent bits, `mbits` mantissa bits.
struct MiniFloat {
  int ebits, mbits, bias;
  bool ieee_specials;  // top exponent encodes inf/NaN (f16, e5m2); else finite-only (e4m3fn, e2m1)
  bool nan_all_ones;   // e4m3fn: S.1111.111 is NaN and so is not a finite value
};
constexpr MiniFloat kF16{5, 10, 15, true, false};
constexpr MiniFloat kE5M2{5, 2, 15, true, false};
constexpr MiniFloat kE4M3{4, 3, 7, false, true};
constexpr MiniFloat kE2M1{2, 1, 1, false, false};

uint32_t encode(const MiniFloat& f, float x) {
  const uint32_t sign = std::signbit(x) ? 1u << (f.ebits + f.mbits) : 0u;
  const uint32_t emax_field = (1u << f.ebits) - 1;
  const uint32_t mmax = (1u << f.mbits) - 1;
  if (std::isnan(x)) {
    if (f.ieee_specials) return sign | (emax_field << f.mbits) | (1u << (f.mbits - 1));
    if (f.nan_all_ones) return sign | (emax_field << f.mbits) | mmax;
    return sign;  // a format without NaN: map to zero
  }
  // Largest finite value as (exponent field, mantissa field).
  uint32_t max_e = f.ieee_specials ? emax_field - 1 : emax_field;
  uint32_t max_m = f.nan_all_ones ? mmax - 1 : mmax;
  const double a = std::fabs(double(x));
  if (a == 0) return sign;
  if (std::isinf(x)) {
    return f.ieee_specials ? sign | (emax_field << f.mbits) : sign | (max_e << f.mbits) | max_m;
  }
  int e2 = 0;
  std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int e = std::max(e2 - 1, 1 - f.bias);  // unbiased exponent, clamped to the subnormal range
  double q = std::nearbyint(std::ldexp(a, f.mbits - e));  // ties to even (default rounding mode)
  if (q >= double(2u << f.mbits)) {  // rounding carried into the next binade
    q /= 2;
    e += 1;
  }
  uint32_t efield, mfield;
  if (q < double(1u << f.mbits)) {  // subnormal
    efield = 0;
    mfield = uint32_t(q);
  } else {
    efield = uint32_t(e + f.bias);
    mfield = uint32_t(q) - (1u << f.mbits);
  }
  if (efield > max_e || (efield == max_e && mfield > max_m)) {
    if (f.ieee_specials) return sign | (emax_field << f.mbits);  // overflow to infinity
    efield = max_e;
    mfield = max_m;  // saturate
  }
  return sign | (efield << f.mbits) | mfield;
}

float decode(const MiniFloat& f, uint32_t bits) {
  const uint32_t emax_field = (1u << f.ebits) - 1;
  const uint32_t mmax = (1u << f.mbits) - 1;
  const bool neg = (bits >> (f.ebits + f.mbits)) & 1u;
  const uint32_t efield = (bits >> f.mbits) & emax_field;
  const uint32_t mfield = bits & mmax;
  double v;
  if (f.ieee_specials && efield == emax_field) {
    v = mfield ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (f.nan_all_ones && efield == emax_field && mfield == mmax) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (efield == 0) {
    v = std::ldexp(double(mfield), 1 - f.bias - f.mbits);
  } else {
    v = std::ldexp(double(mfield + (1u << f.mbits)), int(efield) - f.bias - f.mbits);
  }
  return float(neg ? -v : v);
}

template <class I>
I saturate_round(double v) {
  if (std::isnan(v)) return 0;
  v = std::nearbyint(v);
  if (v <= double(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (v >= double(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return I(v);
}

}  // namespace

std::string_view dtype_name(DType t) { return kNames[int(t)]; }

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (kNames[i] == name) return DType(i);
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias aliases[] = {
      {"F32", DType::f32},      {"BF16", DType::bf16},      {"F16", DType::f16},
      {"F8_E4M3", DType::f8e4m3}, {"F8_E5M2", DType::f8e5m2}, {"F4_E2M1", DType::f4e2m1},
      {"F8_E8M0", DType::e8m0}, {"I32", DType::i32},        {"I64", DType::i64},
      {"U8", DType::u8},        {"float32", DType::f32},    {"bfloat16", DType::bf16},
      {"float16", DType::f16}};
  for (const auto& a : aliases)
    if (a.name == name) return a.t;
  TITAN_FAIL("unknown dtype '" + std::string(name) + "'",
             "use one of f32, bf16, f16, f8e4m3, f8e5m2, f4e2m1, e8m0, i32, i64, u8");
}

float f16_to_f32(f16 v) { return decode(kF16, v.bits); }
f16 f32_to_f16(float f) { return f16{uint16_t(encode(kF16, f))}; }
float f8e4m3_to_f32(f8e4m3 v) { return decode(kE4M3, v.bits); }
f8e4m3 f32_to_f8e4m3(float f) { return f8e4m3{uint8_t(encode(kE4M3, f))}; }
float f8e5m2_to_f32(f8e5m2 v) { return decode(kE5M2, v.bits); }
f8e5m2 f32_to_f8e5m2(float f) { return f8e5m2{uint8_t(encode(kE5M2, f))}; }
float f4e2m1_to_f32(uint8_t nibble) { return decode(kE2M1, nibble & 0xf); }
uint8_t f32_to_f4e2m1(float f) { return uint8_t(encode(kE2M1, f)); }

float e8m0_to_f32(e8m0 v) {
  if (v.bits == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(v.bits) - 127);
}
e8m0 f32_to_e8m0(float f) {
  if (std::isnan(f)) return e8m0{0xff};
  if (!(f > 0)) return e8m0{0};
  if (std::isinf(f)) return e8m0{0xfe};
  int e2 = 0;
  std::frexp(f, &e2);
  return e8m0{uint8_t(std::clamp(e2 - 1 + 127, 0, 254))};
}

double load_as_double(const void* base, DType t, int64_t i) {
  const auto* b = static_cast<const uint8_t*>(base);
  switch (t) {
    case DType::f32: return reinterpret_cast<const float*>(b)[i];
    case DType::bf16: return bf16_to_f32(reinterpret_cast<const bf16*>(b)[i]);
    case DType::f16: return f16_to_f32(reinterpret_cast<const f16*>(b)[i]);
    case DType::f8e4m3: return f8e4m3_to_f32(f8e4m3{b[i]});
    case DType::f8e5m2: return f8e5m2_to_f32(f8e5m2{b[i]});
    case DType::e8m0: return e8m0_to_f32(e8m0{b[i]});
    case DType::f4e2m1: return f4e2m1_to_f32(uint8_t(b[i / 2] >> (4 * (i & 1))));
    case DType::i32: return reinterpret_cast<const int32_t*>(b)[i];
    case DType::i64: return double(reinterpret_cast<const int64_t*>(b)[i]);
    case DType::u8: return b[i];
  }
  return 0;
}

void store_from_double(void* base, DType t, int64_t i, double v) {
  auto* b = static_cast<uint8_t*>(base);
  const float f = float(v);
  switch (t) {
    case DType::f32: reinterpret_cast<float*>(b)[i] = f; break;
    case DType::bf16: reinterpret_cast<bf16*>(b)[i] = f32_to_bf16(f); break;
    case DType::f16: reinterpret_cast<f16*>(b)[i] = f32_to_f16(f); break;
    case DType::f8e4m3: b[i] = f32_to_f8e4m3(f).bits; break;
    case DType::f8e5m2: b[i] = f32_to_f8e5m2(f).bits; break;
    case DType::e8m0: b[i] = f32_to_e8m0(f).bits; break;
    case DType::f4e2m1: {
      const int shift = 4 * int(i & 1);
      b[i / 2] = uint8_t((b[i / 2] & ~(0xf << shift)) | (f32_to_f4e2m1(f) << shift));
      break;
    }
    case DType::i32: reinterpret_cast<int32_t*>(b)[i] = saturate_round<int32_t>(v); break;
    case DType::i64: reinterpret_cast<int64_t*>(b)[i] = saturate_round<int64_t>(v); break;
    case DType::u8: b[i] = saturate_round<uint8_t>(v); break;
  }
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n) {
  if (dst_type == src_type) {
    std::memcpy(dst, src, size_t(n * dtype_bits(dst_type) / 8));
    return;
  }
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    bf16* d = static_cast<bf16*>(dst);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
    return;
  }
  if (src_type == DType::bf16 && dst_type == DType::f32) {
    const bf16* s = static_cast<const bf16*>(src);
    float* d = static_cast<float*>(dst);
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  TITAN_CHECK(dst_type != DType::f4e2m1 || n % 2 == 0, "f4e2m1 buffers hold an even number of elements");
  for (int64_t i = 0; i < n; ++i) store_from_double(dst, dst_type, i, load_as_double(src, src_type, i));
}

}  // namespace titan
