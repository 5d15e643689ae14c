#include "titan/kernels/ref/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "titan/core/dtype.h"

namespace titan::kernels::ref {

namespace {

uint8_t encode(float v, QuantFormat f) { return f == QuantFormat::e4m3 ? f32_to_f8e4m3(v).bits : f32_to_f4e2m1(v); }
float decode(uint8_t code, QuantFormat f) { return f == QuantFormat::e4m3 ? f8e4m3_to_f32(f8e4m3{code}) : f4e2m1_to_f32(code); }
uint8_t nan_code(float v, QuantFormat f) {
  const bool neg = std::signbit(v);
  return f == QuantFormat::e4m3 ? uint8_t(neg ? 0xff : 0x7f) : uint8_t(neg ? 0x8 : 0x0);
}

// Code c of column `col` into the row's bytes (E2M1: its nibble).
void put(uint8_t* row, int64_t col, uint8_t c, QuantFormat f) {
  if (f == QuantFormat::e4m3) {
    row[col] = c;
  } else {
    uint8_t& b = row[col / 2];
    b = uint8_t((col % 2) ? (b & 0x0f) | (c << 4) : (b & 0xf0) | (c & 0x0f));
  }
}
uint8_t get(const uint8_t* row, int64_t col, QuantFormat f) {
  return f == QuantFormat::e4m3 ? row[col] : uint8_t((row[col / 2] >> (4 * (col % 2))) & 0x0f);
}

// A finite tile's scale from its amax (1 for an all-zero tile).
float fp8_scale(float amax, ScaleRule rule) {
  if (!(amax > 0)) return 1;
  // At least the smallest normal f32: a tile of tiny values would otherwise get the scale 0
  // (amax / 448 underflowing, or flushed to zero under the trainer's FTZ / DAZ) and its zeros
  // 0 / 0 = NaN.
  const float s = std::max(amax / 448.0f, std::numeric_limits<float>::min());
  return rule == ScaleRule::pow2 ? float(std::exp2(std::ceil(std::log2(double(s))))) : s;
}

}  // namespace

void mx_quantize(uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols, QuantFormat f) {
  const int emax = f == QuantFormat::e4m3 ? 8 : 2;
  const int64_t blocks = (cols + kMxBlock - 1) / kMxBlock, row_bytes = f == QuantFormat::e4m3 ? cols : cols / 2;
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* cr = codes + r * row_bytes;
    for (int64_t k = 0; k < blocks; ++k) {
      const int64_t c0 = k * kMxBlock, c1 = std::min(cols, c0 + kMxBlock);
      const float* xr = x + r * cols;
      bool finite = true;
      double amax = 0;
      for (int64_t c = c0; c < c1; ++c) {
        finite = finite && std::isfinite(xr[c]);
        amax = std::max(amax, std::fabs(double(xr[c])));
      }
      if (!finite) {
        scales[r * blocks + k] = 0xff;
        for (int64_t c = c0; c < c1; ++c) put(cr, c, nan_code(xr[c], f), f);
        continue;
      }
      int e = -127;
      if (amax > 0) {
        int e2 = 0;
        std::frexp(amax, &e2);  // amax = m 2^e2, m in [0.5, 1): floor(log2 amax) = e2 - 1
        e = std::clamp(e2 - 1 - emax, -127, 127);
      }
      scales[r * blocks + k] = uint8_t(e + 127);
      for (int64_t c = c0; c < c1; ++c) put(cr, c, encode(float(std::ldexp(double(xr[c]), -e)), f), f);
    }
  }
}

void mx_dequantize(float* x, const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, QuantFormat f) {
  const int64_t blocks = (cols + kMxBlock - 1) / kMxBlock, row_bytes = f == QuantFormat::e4m3 ? cols : cols / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t s = scales[r * blocks + c / kMxBlock];
      x[r * cols + c] = s == 0xff ? std::numeric_limits<float>::quiet_NaN()
                                  : decode(get(codes + r * row_bytes, c, f), f) * e8m0_to_f32(e8m0{s});
    }
}

void fp8_block_quantize(uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols, int64_t br,
                        int64_t bc, ScaleRule rule) {
  const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
  for (int64_t i = 0; i < sr; ++i) {
    for (int64_t j = 0; j < sc; ++j) {
      const int64_t r1 = std::min(rows, (i + 1) * br), c1 = std::min(cols, (j + 1) * bc);
      bool finite = true;
      float amax = 0;
      for (int64_t r = i * br; r < r1; ++r)
        for (int64_t c = j * bc; c < c1; ++c) {
          finite = finite && std::isfinite(x[r * cols + c]);
          amax = std::max(amax, std::fabs(x[r * cols + c]));
        }
      if (!finite) {
        scales[i * sc + j] = std::numeric_limits<float>::quiet_NaN();
        for (int64_t r = i * br; r < r1; ++r)
          for (int64_t c = j * bc; c < c1; ++c) codes[r * cols + c] = nan_code(x[r * cols + c], QuantFormat::e4m3);
        continue;
      }
      const float s = fp8_scale(amax, rule);
      scales[i * sc + j] = s;
      for (int64_t r = i * br; r < r1; ++r)
        for (int64_t c = j * bc; c < c1; ++c) codes[r * cols + c] = f32_to_f8e4m3(x[r * cols + c] / s).bits;
    }
  }
}

void fp8_block_dequantize(float* x, const uint8_t* codes, const float* scales, int64_t rows, int64_t cols, int64_t br,
                          int64_t bc) {
  const int64_t sc = (cols + bc - 1) / bc;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scales[(r / br) * sc + c / bc];
      x[r * cols + c] = std::isnan(s) ? std::numeric_limits<float>::quiet_NaN() : f8e4m3_to_f32(f8e4m3{codes[r * cols + c]}) * s;
    }
}

void fp8_block_piece_amax(float* amax, const float* x, int64_t rows, int64_t row0, int64_t total_rows, int64_t cols,
                          int64_t br, int64_t bc) {
  const int64_t sc = (cols + bc - 1) / bc;
  std::fill(amax, amax + (total_rows + br - 1) / br * sc, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    float* tile_row = amax + (row0 + r) / br * sc;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * cols + c];
      float& a = tile_row[c / bc];
      a = std::isfinite(v) ? std::max(a, std::fabs(v)) : std::numeric_limits<float>::infinity();
    }
  }
}

void fp8_block_scales(float* scales, const float* amax, int64_t pieces, int64_t tiles, ScaleRule rule) {
  for (int64_t t = 0; t < tiles; ++t) {
    float a = 0;
    for (int64_t p = 0; p < pieces; ++p) a = std::max(a, amax[p * tiles + t]);
    scales[t] = std::isinf(a) ? std::numeric_limits<float>::quiet_NaN() : fp8_scale(a, rule);
  }
}

void fp8_block_piece_encode(uint8_t* codes, const float* x, const float* scales, int64_t rows, int64_t row0, int64_t cols,
                            int64_t br, int64_t bc) {
  const int64_t sc = (cols + bc - 1) / bc;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = scales[(row0 + r) / br * sc + c / bc], v = x[r * cols + c];
      codes[r * cols + c] = std::isnan(s) ? nan_code(v, QuantFormat::e4m3) : f32_to_f8e4m3(v / s).bits;
    }
}

namespace {
void default_nans(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(x[i])) x[i] = std::numeric_limits<float>::quiet_NaN();
}
}  // namespace

void mx_fake_quantize(float* out, uint8_t* codes, uint8_t* scales, const float* x, int64_t rows, int64_t cols,
                      QuantFormat f, bool along_rows) {
  // Along columns: the transpose [C, R] is quantized along its rows.
  const int64_t r = along_rows ? rows : cols, c = along_rows ? cols : rows;
  std::vector<float> in(x, x + rows * cols), back(size_t(rows * cols));
  if (!along_rows)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) in[j * rows + i] = x[i * cols + j];
  const int64_t code_bytes = f == QuantFormat::e4m3 ? r * c : r * c / 2, scale_bytes = r * ((c + kMxBlock - 1) / kMxBlock);
  std::vector<uint8_t> q(static_cast<size_t>(code_bytes)), s(static_cast<size_t>(scale_bytes));
  mx_quantize(q.data(), s.data(), in.data(), r, c, f);
  mx_dequantize(back.data(), q.data(), s.data(), r, c, f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = along_rows ? back[i * cols + j] : back[j * rows + i];
  default_nans(out, rows * cols);
  if (codes) std::copy(q.begin(), q.end(), codes);
  if (scales) std::copy(s.begin(), s.end(), scales);
}

void fp8_block_fake_quantize(float* out, uint8_t* codes, float* scales, const float* x, int64_t rows, int64_t cols,
                             int64_t br, int64_t bc, ScaleRule rule) {
  std::vector<uint8_t> q(size_t(rows * cols));
  std::vector<float> s(size_t(((rows + br - 1) / br) * ((cols + bc - 1) / bc)));
  fp8_block_quantize(q.data(), s.data(), x, rows, cols, br, bc, rule);
  fp8_block_dequantize(out, q.data(), s.data(), rows, cols, br, bc);
  default_nans(out, rows * cols);
  if (codes) std::copy(q.begin(), q.end(), codes);
  if (scales) std::copy(s.begin(), s.end(), scales);
}

}  // namespace titan::kernels::ref
