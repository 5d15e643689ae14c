#include "titan/kernels/cpu/quantize.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "titan/core/dtype.h"
#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

// The element rounding is branch-free integer and float arithmetic that the compiler vectorizes
// per ISA: for |x| with floor(log2 |x|) = k, the exponent e = max(k, emin) (emin: the format's
// smallest normal exponent) and q = rne(|x| 2^(M - e)) (M mantissa bits; q < 2^(M+1)), the code
// is ((e - emin) << M) + q. That one sum covers normal values (q >= 2^M: the exponent field is
// e - emin + 1 and the mantissa q - 2^M), subnormals (e = emin, q < 2^M) and a rounding carry
// into the next binade (q = 2^(M+1)); saturation is a min with the largest finite code.
namespace titan::kernels::cpu::TITAN_ISA {

namespace {

using ref::QuantFormat;
using ref::ScaleRule;

struct Format {
  int mbits, emin;
  uint32_t max_code;  // the largest finite magnitude's code
  uint32_t sign_bit, nan;
};
constexpr Format kE4M3{3, -6, 0x7e, 0x80, 0x7f};
constexpr Format kE2M1{1, 0, 0x7, 0x8, 0x0};
const Format& format(QuantFormat f) { return f == QuantFormat::e4m3 ? kE4M3 : kE2M1; }

// The code of a finite v (RNE, saturated).
inline uint32_t encode(float v, const Format& f) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const float a = std::min(std::bit_cast<float>(bits & 0x7fffffffu), 65536.0f);  // larger saturates anyway
  const int k = int((std::bit_cast<uint32_t>(a) >> 23) & 0xff) - 127;            // f32 subnormals: below emin
  const int e = std::max(k, f.emin);
  const float step = std::bit_cast<float>(uint32_t(f.mbits - e + 127) << 23);  // 2^(M - e), exact
  const uint32_t q = uint32_t(std::nearbyint(a * step));  // ties to even (the default rounding mode)
  const uint32_t code = std::min((uint32_t(e - f.emin) << f.mbits) + q, f.max_code);
  return code | ((bits >> 31) ? f.sign_bit : 0u);
}

inline uint32_t nan_code(float v, const Format& f) { return f.nan | ((std::bit_cast<uint32_t>(v) >> 31) ? f.sign_bit : 0u); }

// Whether x[0, n) is all finite, and its largest magnitude.
inline bool finite_amax(const float* x, int64_t n, float& amax) {
  uint32_t worst = 0;  // the largest |x| bit pattern: above 0x7f7fffff means inf or NaN
#pragma omp simd reduction(max : worst)
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  amax = std::bit_cast<float>(worst);
  return worst <= 0x7f7fffffu;
}

float decode_e4m3(uint8_t c) { return f8e4m3_to_f32(f8e4m3{c}); }

// code -> value tables, made once.
struct Tables {
  float e4m3[256], e2m1[16];
  Tables() {
    for (int c = 0; c < 256; ++c) e4m3[c] = decode_e4m3(uint8_t(c));
    for (int c = 0; c < 16; ++c) e2m1[c] = f4e2m1_to_f32(uint8_t(c));
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void mx_quantize(uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols, QuantFormat fmt) {
  const Format& f = format(fmt);
  const bool fp4 = fmt == QuantFormat::e2m1;
  const int emax = fp4 ? 2 : 8;
  const int64_t blocks = (cols + ref::kMxBlock - 1) / ref::kMxBlock, row_bytes = fp4 ? cols / 2 : cols;
  parallel_for(0, rows * blocks, 256, [&](int64_t lo, int64_t hi) {
    uint8_t c[ref::kMxBlock];
    for (int64_t b = lo; b < hi; ++b) {
      const int64_t r = b / blocks, c0 = (b % blocks) * ref::kMxBlock, n = std::min(ref::kMxBlock, cols - c0);
      const float* xb = x + r * cols + c0;
      float amax = 0;
      if (!finite_amax(xb, n, amax)) {
        scales[b] = 0xff;
        for (int64_t i = 0; i < n; ++i) c[i] = uint8_t(nan_code(xb[i], f));
      } else {
        // floor(log2 amax) from its exponent field; an f32 subnormal amax lands below -127 anyway.
        const int k = amax > 0 ? int((std::bit_cast<uint32_t>(amax) >> 23) & 0xff) - 127 : -127 - emax;
        const int e = std::clamp(k - emax, -127, 127);
        scales[b] = uint8_t(e + 127);
        const float inv = std::ldexp(1.0f, -e);  // exact: 2^-e with e in [-127, 127]
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) c[i] = uint8_t(encode(xb[i] * inv, f));
      }
      uint8_t* out = codes + r * row_bytes + (fp4 ? c0 / 2 : c0);
      if (!fp4) {
        std::copy(c, c + n, out);
      } else {
        for (int64_t i = 0; i < n / 2; ++i) out[i] = uint8_t(c[2 * i] | (c[2 * i + 1] << 4));
      }
    }
  });
}

void mx_dequantize(float* x, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, QuantFormat fmt) {
  const bool fp4 = fmt == QuantFormat::e2m1;
  const float* lut = fp4 ? tables().e2m1 : tables().e4m3;
  const int64_t blocks = (cols + ref::kMxBlock - 1) / ref::kMxBlock, row_bytes = fp4 ? cols / 2 : cols;
  parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const uint8_t* cr = codes + r * row_bytes;
      for (int64_t k = 0; k < blocks; ++k) {
        const uint8_t byte = scales[r * blocks + k];
        const float s = e8m0_to_f32(e8m0{byte});
        const int64_t c0 = k * ref::kMxBlock, c1 = std::min(cols, c0 + ref::kMxBlock);
        if (byte == 0xff) {
          std::fill(x + r * cols + c0, x + r * cols + c1, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t code = fp4 ? uint8_t((cr[c / 2] >> (4 * (c % 2))) & 0x0f) : cr[c];
          x[r * cols + c] = lut[code] * s;
        }
      }
    }
  });
}

void fp8_block_quantize(uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
                        int64_t bc, ScaleRule rule) {
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  parallel_for(0, sr * sc, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t i = t / sc, j = t % sc, r1 = std::min(rows, (i + 1) * br), c0 = j * bc, n = std::min(cols, c0 + bc) - c0;
      bool finite = true;
      float amax = 0;
      for (int64_t r = i * br; r < r1; ++r) {
        float m = 0;
        finite = finite_amax(x + r * cols + c0, n, m) && finite;
        amax = std::max(amax, m);
      }
      if (!finite) {
        scales[t] = std::numeric_limits<float>::quiet_NaN();
        for (int64_t r = i * br; r < r1; ++r)
          for (int64_t c = c0; c < c0 + n; ++c) codes[r * cols + c] = uint8_t(nan_code(x[r * cols + c], kE4M3));
        continue;
      }
      float s = 1;
      if (amax > 0) {
        s = amax / 448.0f;
        if (rule == ScaleRule::pow2) s = float(std::exp2(std::ceil(std::log2(double(s)))));
      }
      scales[t] = s;
      for (int64_t r = i * br; r < r1; ++r) {
        const float* xr = x + r * cols + c0;
        uint8_t* cr = codes + r * cols + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) cr[c] = uint8_t(encode(xr[c] / s, kE4M3));
      }
    }
  });
}

void fp8_block_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t br,
                          int64_t bc) {
  const float* lut = tables().e4m3;
  const int64_t sc = (cols + bc - 1) / bc;
  parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* sr = scales + (r / br) * sc;
      for (int64_t c = 0; c < cols; ++c)
        x[r * cols + c] = std::isnan(sr[c / bc]) ? std::numeric_limits<float>::quiet_NaN() : lut[codes[r * cols + c]] * sr[c / bc];
    }
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
