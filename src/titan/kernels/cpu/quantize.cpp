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
  float max_value;  // the largest finite magnitude
};
constexpr Format kE4M3{3, -6, 0x7e, 0x80, 0x7f, 448.0f};
constexpr Format kE2M1{1, 0, 0x7, 0x8, 0x0, 6.0f};
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

// The code of v, NaN included (as core/dtype.h encodes it).
inline uint32_t encode_any(float v, const Format& f) { return v != v ? nan_code(v, f) : encode(v, f); }

// decode(encode(v)) for v finite or NaN (a NaN comes back a NaN): v rounded to f's nearest value
// (RNE, saturated), with v's sign.
inline float round_to(float v, const Format& f) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const float a = std::min(std::bit_cast<float>(bits & 0x7fffffffu), 65536.0f);  // NaN stays NaN
  const int k = int((std::bit_cast<uint32_t>(a) >> 23) & 0xff) - 127;
  const int e = std::clamp(k, f.emin, 16);                                        // 16: NaN's, harmless
  const float step = std::bit_cast<float>(uint32_t(f.mbits - e + 127) << 23);     // 2^(M - e)
  const float unit = std::bit_cast<float>(uint32_t(e - f.mbits + 127) << 23);     // 2^(e - M)
  const float r = std::min(std::nearbyint(a * step) * unit, f.max_value);        // NaN stays NaN
  return std::bit_cast<float>(std::bit_cast<uint32_t>(r) | (bits & 0x80000000u));
}

// A fake-quantized value: v's rounding times the block's scale, a NaN the default quiet NaN.
inline float fake(float v, float scale, const Format& f) {
  const float r = round_to(v, f) * scale;
  return r != r ? std::numeric_limits<float>::quiet_NaN() : r;
}

inline uint32_t magnitude_bits(float v) { return std::bit_cast<uint32_t>(v) & 0x7fffffffu; }
constexpr uint32_t kMaxFiniteBits = 0x7f7fffffu;  // magnitude bits above this: an infinity or a NaN

// Whether x[0, n) is all finite, and its largest magnitude.
inline bool finite_amax(const float* x, int64_t n, float& amax) {
  uint32_t worst = 0;  // the largest |x| bit pattern: above 0x7f7fffff means inf or NaN
#pragma omp simd reduction(max : worst)
  for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  amax = std::bit_cast<float>(worst);
  return worst <= 0x7f7fffffu;
}

float decode_e4m3(uint8_t c) { return f8e4m3_to_f32(f8e4m3{c}); }


// An E4M3 code's value, computed rather than looked up so that it vectorizes (integer selects
// and masks only): exponent field e, mantissa m: normal 2^(e - 7) (1 + m / 8) (f32 exponent field e + 120),
// subnormal m 2^-9; the NaN codes (0x7f, 0xff) give nan_pos / nan_neg, the bits core/dtype.h's
// decoder gives (the caller hoists them).
inline float decode_e4m3_value(uint32_t c, uint32_t nan_pos, uint32_t nan_neg) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 0x7u, neg = c >> 7;
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(int(m)) * 0x1p-9f);
  const uint32_t is_sub = 0u - uint32_t(e == 0), is_nan = 0u - uint32_t((c & 0x7fu) == 0x7fu), is_neg = 0u - neg;
  const uint32_t magnitude = (subnormal & is_sub) | ((((e + 120) << 23) | (m << 20)) & ~is_sub);
  const uint32_t nan_bits = (nan_neg & is_neg) | (nan_pos & ~is_neg);
  return std::bit_cast<float>((nan_bits & is_nan) | ((magnitude | (neg << 31)) & ~is_nan));
}

// An E2M1 nibble's value: normal 2^(e - 1) (1 + m / 2) (f32 exponent field e + 126), subnormal m / 2.
inline float decode_e2m1_value(uint32_t c) {
  const uint32_t e = (c >> 1) & 0x3u, m = c & 0x1u, is_sub = 0u - uint32_t(e == 0);
  const uint32_t magnitude = ((0x3f000000u * m) & is_sub) | ((((e + 126) << 23) | (m << 22)) & ~is_sub);  // sub: m / 2
  return std::bit_cast<float>(magnitude | ((c & 0x8u) << 28));
}

// The bits of E4M3's NaN codes' values (+NaN 0x7f, -NaN 0xff) as core/dtype.h decodes them.
struct E4M3Nans {
  uint32_t bits[2];
  E4M3Nans() : bits{std::bit_cast<uint32_t>(decode_e4m3(0x7f)), std::bit_cast<uint32_t>(decode_e4m3(0xff))} {}
};
const E4M3Nans& e4m3_nans() {
  static const E4M3Nans n;
  return n;
}

}  // namespace

void mx_dequantize(float* x, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, QuantFormat fmt) {
  const bool fp4 = fmt == QuantFormat::e2m1;
  const int64_t blocks = (cols + ref::kMxBlock - 1) / ref::kMxBlock, row_bytes = fp4 ? cols / 2 : cols;
  const uint32_t nan_pos = e4m3_nans().bits[0], nan_neg = e4m3_nans().bits[1];
  parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const uint8_t* cr = codes + r * row_bytes;
      for (int64_t k = 0; k < blocks; ++k) {
        const uint8_t byte = scales[r * blocks + k];
        const float s = e8m0_to_f32(e8m0{byte});
        const int64_t c0 = k * ref::kMxBlock, n = std::min(cols, c0 + ref::kMxBlock) - c0;
        float* xb = x + r * cols + c0;
        if (byte == 0xff) {
          std::fill(xb, xb + n, std::numeric_limits<float>::quiet_NaN());
        } else if (fp4) {
          const uint8_t* cb = cr + c0 / 2;  // c0 is a multiple of 32: whole bytes
#pragma omp simd
          for (int64_t i = 0; i < n / 2; ++i) {  // n is even: rows of MXFP4 codes are
            xb[2 * i] = decode_e2m1_value(cb[i] & 0x0fu) * s;
            xb[2 * i + 1] = decode_e2m1_value(uint32_t(cb[i]) >> 4) * s;
          }
        } else {
          const uint8_t* cb = cr + c0;
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) xb[c] = decode_e4m3_value(cb[c], nan_pos, nan_neg) * s;
        }
      }
    }
  });
}

void fp8_block_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t br,
                          int64_t bc) {
  const int64_t sc = (cols + bc - 1) / bc;
  const uint32_t nan_pos = e4m3_nans().bits[0], nan_neg = e4m3_nans().bits[1];
  parallel_for(0, rows, 64, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* sr = scales + (r / br) * sc;
      for (int64_t j = 0; j < sc; ++j) {  // one tile's stretch of the row: one scale
        const int64_t c0 = j * bc, n = std::min(cols, c0 + bc) - c0;
        const float s = sr[j];
        float* xr = x + r * cols + c0;
        const uint8_t* cr = codes + r * cols + c0;
        if (std::isnan(s)) {
          std::fill(xr, xr + n, std::numeric_limits<float>::quiet_NaN());
          continue;
        }
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) xr[c] = decode_e4m3_value(cr[c], nan_pos, nan_neg) * s;
      }
    }
  });
}

namespace {

// Columns per chunk when blocks run down the columns: the per-column amax and scales stay in
// registers / L1 while the block's rows stream by.
constexpr int64_t kColumnChunk = 64;

// worst[0, n) = the largest magnitude bits of columns c0 .. c0 + n over rows r0 .. r1 of x
// (above kMaxFiniteBits: the column holds an infinity or a NaN).
inline void column_worst(uint32_t* worst, const float* x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t n) {
  std::fill(worst, worst + n, 0u);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * cols + c0;
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) worst[c] = std::max(worst[c], magnitude_bits(xr[c]));
  }
}

// The MX scale exponent of a block whose largest magnitude is amax (finite), as mx_quantize.
inline int mx_exponent(float amax, int emax) {
  const int k = amax > 0 ? int((std::bit_cast<uint32_t>(amax) >> 23) & 0xff) - 127 : -127 - emax;
  return std::clamp(k - emax, -127, 127);
}

// FP8 blockwise's scale of a finite tile.
inline float fp8_scale(float amax, ScaleRule rule) {
  if (!(amax > 0)) return 1;
  const float s = std::max(amax / 448.0f, std::numeric_limits<float>::min());  // never 0: ref/quantize.h
  return rule == ScaleRule::pow2 ? float(std::exp2(std::ceil(std::log2(double(s))))) : s;
}

// MX blocks of 32 along rows: one block at a time, codes and / or values (either may be null) in
// one pass after its amax.
void mx_fake_rows(float* out, uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                  QuantFormat fmt) {
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
      const bool finite = finite_amax(xb, n, amax);
      const int e = finite ? mx_exponent(amax, emax) : 0;
      // A block with an infinity or a NaN: NaN scale (0xff), so NaN values and NaN codes.
      const float inv = finite ? std::ldexp(1.0f, -e) : std::numeric_limits<float>::quiet_NaN();
      const float s = finite ? e8m0_to_f32(e8m0{uint8_t(e + 127)}) : inv;
      if (scales) scales[b] = finite ? uint8_t(e + 127) : 0xff;
      if (codes) {
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) c[i] = uint8_t(finite ? encode(xb[i] * inv, f) : nan_code(xb[i], f));
        uint8_t* dst = codes + r * row_bytes + (fp4 ? c0 / 2 : c0);
        if (!fp4) {
          for (int64_t i = 0; i < n; ++i) dst[i] = c[i];
        } else {
          for (int64_t i = 0; i < n / 2; ++i) dst[i] = uint8_t(c[2 * i] | (c[2 * i + 1] << 4));
        }
      }
      if (!out) continue;
      float* ob = out + r * cols + c0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) ob[i] = fake(xb[i] * inv, s, f);
    }
  });
}

// MX blocks of 32 down the columns, without a transpose: per strip of 32 rows and chunk of
// columns, the columns' amaxes accumulate row by row, then the rows are rounded.
void mx_fake_columns(float* out, const float* x, int64_t rows, int64_t cols, QuantFormat fmt) {
  const Format& f = format(fmt);
  const int emax = fmt == QuantFormat::e2m1 ? 2 : 8;
  const int64_t strips = (rows + ref::kMxBlock - 1) / ref::kMxBlock, chunks = (cols + kColumnChunk - 1) / kColumnChunk;
  parallel_for(0, strips * chunks, 1, [&](int64_t lo, int64_t hi) {
    uint32_t worst[kColumnChunk];
    float inv[kColumnChunk], s[kColumnChunk];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t r0 = (t / chunks) * ref::kMxBlock, r1 = std::min(rows, r0 + ref::kMxBlock);
      const int64_t c0 = (t % chunks) * kColumnChunk, n = std::min(kColumnChunk, cols - c0);
      column_worst(worst, x, cols, r0, r1, c0, n);
      for (int64_t i = 0; i < n; ++i) {
        const bool finite = worst[i] <= kMaxFiniteBits;
        const int e = finite ? mx_exponent(std::bit_cast<float>(worst[i]), emax) : 0;
        inv[i] = finite ? std::ldexp(1.0f, -e) : std::numeric_limits<float>::quiet_NaN();
        s[i] = finite ? e8m0_to_f32(e8m0{uint8_t(e + 127)}) : inv[i];
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * cols + c0;
        float* orow = out + r * cols + c0;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) orow[i] = fake(xr[i] * inv[i], s[i], f);
      }
    }
  });
}

// FP8 tiles at least kColumnChunk / 4 wide: one tile at a time. Here and in fp8_fake_narrow,
// codes (with scales) or out may be null.
void fp8_fake_wide(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
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
      const float s = finite ? fp8_scale(amax, rule) : std::numeric_limits<float>::quiet_NaN();
      if (scales) scales[t] = s;
      for (int64_t r = i * br; r < r1; ++r) {
        const float* xr = x + r * cols + c0;
        if (codes) {
          uint8_t* cr = codes + r * cols + c0;
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) cr[c] = uint8_t(finite ? encode_any(xr[c] / s, kE4M3) : nan_code(xr[c], kE4M3));
        }
        if (!out) continue;
        float* orow = out + r * cols + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) orow[c] = fake(xr[c] / s, s, kE4M3);
      }
    }
  });
}

// Narrow FP8 tiles (128 x 1 across tokens): per strip of br rows and chunk of whole tiles, the
// columns' amaxes accumulate row by row, then the rows are rounded.
void fp8_fake_narrow(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
                     int64_t bc, ScaleRule rule) {
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  const int64_t width = (kColumnChunk / bc) * bc, chunks = (cols + width - 1) / width;
  parallel_for(0, sr * chunks, 1, [&](int64_t lo, int64_t hi) {
    uint32_t worst[kColumnChunk];
    float s[kColumnChunk];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t i = t / chunks, r0 = i * br, r1 = std::min(rows, r0 + br);
      const int64_t c0 = (t % chunks) * width, n = std::min(width, cols - c0);
      column_worst(worst, x, cols, r0, r1, c0, n);
      for (int64_t a = 0; a < n; a += bc) {  // each tile of the chunk
        const int64_t b = std::min(n, a + bc);
        const uint32_t w = *std::max_element(worst + a, worst + b);
        const float scale = w <= kMaxFiniteBits ? fp8_scale(std::bit_cast<float>(w), rule)
                                                : std::numeric_limits<float>::quiet_NaN();
        if (scales) scales[i * sc + (c0 + a) / bc] = scale;
        std::fill(s + a, s + b, scale);
      }
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * cols + c0;
        if (codes) {
          uint8_t* cr = codes + r * cols + c0;
#pragma omp simd
          for (int64_t c = 0; c < n; ++c)
            cr[c] = uint8_t(s[c] == s[c] ? encode_any(xr[c] / s[c], kE4M3) : nan_code(xr[c], kE4M3));
        }
        if (!out) continue;
        float* orow = out + r * cols + c0;
#pragma omp simd
        for (int64_t c = 0; c < n; ++c) orow[c] = fake(xr[c] / s[c], s[c], kE4M3);
      }
    }
  });
}

}  // namespace

void mx_fake_quantize(float* out, uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                      QuantFormat fmt, bool along_rows) {
  if (along_rows)
    mx_fake_rows(out, codes, scales, x, rows, cols, fmt);
  else
    mx_fake_columns(out, x, rows, cols, fmt);
}

void fp8_block_fake_quantize(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols,
                             int64_t br, int64_t bc, ScaleRule rule) {
  if (bc * 4 >= kColumnChunk)
    fp8_fake_wide(out, codes, scales, x, rows, cols, br, bc, rule);
  else
    fp8_fake_narrow(out, codes, scales, x, rows, cols, br, bc, rule);
}

// The quantizers alone: the fused passes without the values.
void mx_quantize(uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols, QuantFormat fmt) {
  mx_fake_rows(nullptr, codes, scales, x, rows, cols, fmt);
}

void fp8_block_quantize(uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
                        int64_t bc, ScaleRule rule) {
  cpu::TITAN_ISA::fp8_block_fake_quantize(nullptr, codes, scales, x, rows, cols, br, bc, rule);  // not ref:: (ADL)
}

}  // namespace titan::kernels::cpu::TITAN_ISA
