// kernels/quantize.h: MXFP8 / MXFP4 (OCP MX v1.0) and DeepSeek-V3's FP8 blockwise quantization.
// The reference is checked against values worked out by hand from the spec (ties to even,
// saturation, subnormals, zero / NaN / infinite blocks, the scale's range); the fast kernels must
// equal the reference bit for bit at every ISA level this CPU has, on awkward shapes (ragged last
// blocks and tiles) and values over a wide range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/backend_compare.h"
#include "common/error_of.h"
#include "common/kernel_check.h"
#include "titan/core/rng.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/quantize.h"

using namespace titan;
using kernels::ScaleRule;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN(), kInf = std::numeric_limits<float>::infinity();

Tensor matrix(int64_t rows, int64_t cols, const std::vector<float>& v) {
  Tensor t = Tensor::zeros({rows, cols}, DType::f32);
  std::memcpy(t.data<float>(), v.data(), std::min(v.size(), size_t(rows * cols)) * 4);
  return t;
}

// Values spread over 2^-30 .. 2^30 in magnitude, both signs, some exact zeros.
Tensor wide(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::f32);
  Generator g(seed, "quantize");
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = g.next_uniform(), e = 60 * g.next_uniform() - 30;
    t.data<float>()[i] = u < 0.05 ? 0.0f : float((u < 0.5 ? -1 : 1) * std::exp2(e) * (1 + g.next_uniform()));
  }
  return t;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

struct Mx {
  Tensor codes, scales, back;
};

Mx mx(const Tensor& x, DType element) {
  Mx m{Tensor::empty(x.shape(), element), Tensor::empty({x.size(0), (x.size(1) + 31) / 32}, DType::e8m0),
       Tensor::empty(x.shape(), DType::f32)};
  kernels::mx_quantize(m.codes, m.scales, x);
  kernels::mx_dequantize(m.back, m.codes, m.scales);
  return m;
}

using test::on_reference;

std::vector<double> values(const Tensor& t) { return test::to_doubles(t); }

}  // namespace

TEST(Quantize, MxFp8ReferenceFollowsTheSpec) {
  // Block 0: amax 448 -> floor(log2 448) = 8 = emax, scale 2^0. 1 + 1/16 is halfway between 1 and
  // 1.125 (ties to even: 1), 1 + 3/16 between 1.125 and 1.25 (even: 1.25), 2^-10 is half the
  // smallest subnormal 2^-9 (even: 0), 3 * 2^-10 rounds to 2 * 2^-9, -0 stays -0.
  // Block 1 (columns 32..63): amax 500 -> scale 2^0 and 500 saturates to 448; 0.001 becomes a
  // subnormal multiple of 2^-9.
  std::vector<float> v(64 * 2, 0.0f);
  const float row0[] = {448, 1.0625f, 1.1875f, std::ldexp(1.0f, -10), 3 * std::ldexp(1.0f, -10), -0.0f, -3.5f};
  std::copy(std::begin(row0), std::end(row0), v.begin());
  v[32] = 500, v[33] = 0.001f, v[34] = -500;
  // Row 1: block 0 all zeros (scale byte 0: 2^-127); block 1 tiny, amax 2^-130 (a subnormal f32):
  // floor(log2) - 8 = -138 clamps to -127, and 2^-130 = 2^-3 x 2^-127 is still exact.
  v[64 + 32] = std::ldexp(1.0f, -130);
  const Tensor x = matrix(2, 64, v);
  const Mx m = on_reference([&] { return mx(x, DType::f8e4m3); });
  const std::vector<uint8_t> s = bytes_of(m.scales);
  EXPECT_EQ(s, (std::vector<uint8_t>{127, 127, 0, 0}));
  const std::vector<double> b = values(m.back);
  EXPECT_EQ(b[0], 448);
  EXPECT_EQ(b[1], 1.0);
  EXPECT_EQ(b[2], 1.25);
  EXPECT_EQ(b[3], 0.0);
  EXPECT_EQ(b[4], std::ldexp(1.0, -8));
  EXPECT_TRUE(b[5] == 0 && std::signbit(b[5]));
  EXPECT_EQ(b[6], -3.5);
  EXPECT_EQ(b[32], 448);
  EXPECT_EQ(b[33], std::round(0.001 * 512) / 512);
  EXPECT_EQ(b[34], -448);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(b[64 + c], 0.0);
  EXPECT_EQ(b[64 + 32], std::ldexp(1.0, -130));
}

TEST(Quantize, MxFp4ReferenceFollowsTheSpec) {
  // amax 6 -> floor(log2 6) = 2 = emax, scale 2^0. Ties: 2.5 -> 2, 5 -> 4, 0.25 -> 0, 0.75 -> 1
  // (even codes); 7 saturates to 6; -1.5 exact. Block 1: amax 12 -> scale 2^1: 11 / 2 = 5.5 -> 6,
  // 1 / 2 = 0.5 exact, 0.9 / 2 = 0.45 -> 0.5.
  std::vector<float> v(64, 0.0f);
  const float b0[] = {6, 2.5f, 5, 0.25f, 0.75f, 7, -1.5f, -0.0f};
  std::copy(std::begin(b0), std::end(b0), v.begin());
  v[32] = 12, v[33] = 11, v[34] = 1, v[35] = 0.9f;
  const Tensor x = matrix(1, 64, v);
  const Mx m = on_reference([&] { return mx(x, DType::f4e2m1); });
  EXPECT_EQ(bytes_of(m.scales), (std::vector<uint8_t>{127, 128}));
  const std::vector<double> b = values(m.back);
  EXPECT_EQ(std::vector<double>(b.begin(), b.begin() + 7), (std::vector<double>{6, 2, 4, 0, 1, 6, -1.5}));
  EXPECT_EQ(std::vector<double>(b.begin() + 32, b.begin() + 36), (std::vector<double>{12, 12, 1, 1}));
  // Packing: two codes per byte, the low nibble the even column: 6 = 0x7, 2 = 0x4 -> 0x47.
  EXPECT_EQ(bytes_of(m.codes)[0], 0x47);
}

TEST(Quantize, NonFiniteBlocksGetTheNaNScale) {
  std::vector<float> v(96, 1.0f);
  v[3] = kNaN;   // block 0
  v[40] = -kInf;  // block 1
  const Tensor x = matrix(1, 96, v);  // block 2 finite
  for (const DType e : {DType::f8e4m3, DType::f4e2m1}) {
    const Mx m = on_reference([&] { return mx(x, e); });
    const uint8_t ones = e == DType::f4e2m1 ? 125 : 119;  // 1.0: 2^(0 - emax)
    EXPECT_EQ(bytes_of(m.scales), (std::vector<uint8_t>{0xff, 0xff, ones}));
    const std::vector<double> b = values(m.back);
    EXPECT_TRUE(std::isnan(b[0]) && std::isnan(b[40]));
    EXPECT_EQ(b[64], 1.0);
  }
  // FP8 blockwise: the tile holding a NaN gets a NaN scale; the other tile is untouched.
  const Tensor y = matrix(2, 4, {1, 2, kNaN, 4, 5, 6, 7, 8});
  Tensor codes = Tensor::empty({2, 4}, DType::f8e4m3), scales = Tensor::empty({1, 2}, DType::f32);
  on_reference([&] {
    kernels::fp8_block_quantize(codes, scales, y, 2, 2);
    return 0;
  });
  EXPECT_EQ(scales.data<float>()[0], 6.0f / 448);
  EXPECT_TRUE(std::isnan(scales.data<float>()[1]));
}

TEST(Quantize, Fp8BlockwiseScalesByAmaxOrAPowerOfTwo) {
  // One 1 x 4 tile: amax 3.3; amax rule s = 3.3 / 448, pow2 rule s = 2^ceil(log2(3.3 / 448)) = 2^-7.
  const Tensor x = matrix(1, 4, {3.3f, -1, 0.01f, 0});
  Tensor codes = Tensor::empty({1, 4}, DType::f8e4m3), scales = Tensor::empty({1, 1}, DType::f32);
  Tensor back = Tensor::empty({1, 4}, DType::f32);
  for (const ScaleRule rule : {ScaleRule::amax, ScaleRule::pow2}) {
    on_reference([&] {
      kernels::fp8_block_quantize(codes, scales, x, 1, 4, rule);
      kernels::fp8_block_dequantize(back, codes, scales, 1, 4);
      return 0;
    });
    const float s = scales.data<float>()[0];
    EXPECT_EQ(s, rule == ScaleRule::amax ? 3.3f / 448 : std::ldexp(1.0f, -7));
    const std::vector<double> b = values(back);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(b[size_t(i)], double(f8e4m3_to_f32(f32_to_f8e4m3(x.data<float>()[i] / s)) * s)) << i;
    // The amax maps to 448 under the amax rule; under pow2, 3.3 / 2^-7 = 422.4 -> 416 (steps of 32).
    EXPECT_EQ(b[0], rule == ScaleRule::amax ? double(448 * s) : 3.25);
    EXPECT_EQ(b[3], 0.0);
  }
  // An all-zero tile has scale 1.
  const Tensor z = Tensor::zeros({1, 4}, DType::f32);
  on_reference([&] {
    kernels::fp8_block_quantize(codes, scales, z, 1, 4);
    return 0;
  });
  EXPECT_EQ(scales.data<float>()[0], 1.0f);
}

TEST(Quantize, FastKernelsEqualTheReferenceBitForBitAtEveryIsaLevel) {
  struct Shape2 {
    int64_t rows, cols;
  };
  // Ragged last MX blocks (200 = 6 x 32 + 8, 34), one short row (2), FP8 tiles ragged both ways.
  const std::vector<Shape2> shapes = {{3, 200}, {1, 2}, {17, 34}, {130, 257}, {64, 4096}};
  for (const Shape2& sh : shapes) {
    Tensor x = wide(sh.rows, sh.cols, uint64_t(sh.rows * 1000 + sh.cols));
    // Special values in the first row (ties, saturation, NaN, infinity) when it is long enough.
    const float special[] = {kNaN, 1.0625f, 1.1875f, 500, -kInf, std::ldexp(1.0f, -140), -0.0f, 2.5f};
    if (sh.cols >= 8 && sh.rows > 1) std::memcpy(x.data<float>(), special, sizeof(special));
    const int64_t even_cols = sh.cols - sh.cols % 2;
    const Tensor x4 = x.slice(1, 0, even_cols).contiguous();
    const Mx want8 = on_reference([&] { return mx(x, DType::f8e4m3); });
    const Mx want4 = on_reference([&] { return mx(x4, DType::f4e2m1); });
    struct Fp8 {
      Tensor codes, scales;
    };
    auto fp8 = [&](int64_t br, int64_t bc, ScaleRule rule) {
      Fp8 f{Tensor::empty(x.shape(), DType::f8e4m3),
            Tensor::empty({(sh.rows + br - 1) / br, (sh.cols + bc - 1) / bc}, DType::f32)};
      kernels::fp8_block_quantize(f.codes, f.scales, x, br, bc, rule);
      return f;
    };
    test::for_each_isa([&](CpuCapability isa) {
      std::string where = x.shape().str();
      where += " at ";
      where += test::isa_label(isa);
      const Mx got8 = mx(x, DType::f8e4m3), got4 = mx(x4, DType::f4e2m1);
      EXPECT_EQ(bytes_of(got8.codes), bytes_of(want8.codes)) << "MXFP8 codes " << where;
      EXPECT_EQ(bytes_of(got8.scales), bytes_of(want8.scales)) << "MXFP8 scales " << where;
      EXPECT_EQ(bytes_of(got8.back), bytes_of(want8.back)) << "MXFP8 dequantized " << where;
      EXPECT_EQ(bytes_of(got4.codes), bytes_of(want4.codes)) << "MXFP4 codes " << where;
      EXPECT_EQ(bytes_of(got4.scales), bytes_of(want4.scales)) << "MXFP4 scales " << where;
      EXPECT_EQ(bytes_of(got4.back), bytes_of(want4.back)) << "MXFP4 dequantized " << where;
      for (const auto& [br, bc] : std::vector<std::pair<int64_t, int64_t>>{{1, 128}, {128, 128}})
        for (const ScaleRule rule : {ScaleRule::amax, ScaleRule::pow2}) {
          const Fp8 got = fp8(br, bc, rule), want = on_reference([&] { return fp8(br, bc, rule); });
          EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes)) << "FP8 " << br << "x" << bc << " codes " << where;
          EXPECT_EQ(bytes_of(got.scales), bytes_of(want.scales)) << "FP8 " << br << "x" << bc << " scales " << where;
          Tensor a = Tensor::empty(x.shape(), DType::f32);
          kernels::fp8_block_dequantize(a, got.codes, got.scales, br, bc);
          Tensor b = on_reference([&] {
            Tensor t = Tensor::empty(x.shape(), DType::f32);
            kernels::fp8_block_dequantize(t, want.codes, want.scales, br, bc);
            return t;
          });
          EXPECT_EQ(bytes_of(a), bytes_of(b)) << "FP8 dequantized " << where;
        }
    });
  }
}

TEST(Quantize, BadShapesAreRefusedWithTheShapeThatWorks) {
  const Tensor x = Tensor::zeros({2, 33}, DType::f32);
  Tensor codes = Tensor::empty({2, 33}, DType::f4e2m1), scales = Tensor::empty({2, 2}, DType::e8m0);
  EXPECT_NE(test::error_of([&] { kernels::mx_quantize(codes, scales, x); }).find("even length"), std::string::npos);
  Tensor c8 = Tensor::empty({2, 33}, DType::f8e4m3), s1 = Tensor::empty({2, 1}, DType::e8m0);
  EXPECT_NE(test::error_of([&] { kernels::mx_quantize(c8, s1, x); }).find("[2, 2]"), std::string::npos);
}

// FSDP's FP8 all-gather: a matrix split by rows into N pieces of ceil(R / N) rows (the last ones
// padded, or all padding), each piece's amax grid, their max as scales, each piece encoded: the
// whole matrix's codes and scales from fp8_block_quantize, bit for bit. Pieces cut tiles (300 rows
// in pieces of 150, 100, 75: tiles of 128 rows cut at 150, 200, 225), one piece is all padding
// (5 rows over 4 pieces of 2), and tiles hold a NaN, an infinity and only zeros.
TEST(Quantize, Fp8BlockwisePiecesEqualTheWholeMatrix) {
  struct Case {
    int64_t rows, cols, br, bc;
  };
  for (const Case& c : std::vector<Case>{{300, 200, 128, 128}, {5, 7, 2, 3}, {257, 256, 128, 128}}) {
    Tensor x = wide(c.rows, c.cols, uint64_t(c.rows * 7 + c.cols));
    float* v = x.data<float>();
    v[0] = kNaN;                                        // tile (0, 0)
    v[(c.rows - 1) * c.cols + c.cols - 1] = -kInf;      // the last tile
    for (int64_t r = 0; r < std::min(c.rows, c.br); ++r)  // tile (0, 1) all zero
      for (int64_t k = c.bc; k < std::min(c.cols, 2 * c.bc); ++k) v[r * c.cols + k] = 0;
    const int64_t sr = (c.rows + c.br - 1) / c.br, sc = (c.cols + c.bc - 1) / c.bc;
    Tensor want_codes = Tensor::empty(x.shape(), DType::f8e4m3), want_scales = Tensor::empty({sr, sc}, DType::f32);
    kernels::fp8_block_quantize(want_codes, want_scales, x, c.br, c.bc);
    for (const int64_t n : {1, 2, 3, 4}) {
      const int64_t rows = (c.rows + n - 1) / n;
      Tensor padded = Tensor::zeros({n * rows, c.cols}, DType::f32);
      padded.slice(0, 0, c.rows).copy_(x);
      Tensor amax = Tensor::empty({n, sr, sc}, DType::f32), scales = Tensor::empty({sr, sc}, DType::f32);
      for (int64_t p = 0; p < n; ++p) {
        Tensor grid = amax.select(0, p);
        kernels::fp8_block_piece_amax(grid, padded.slice(0, p * rows, p * rows + rows), p * rows, c.rows, c.br, c.bc);
      }
      kernels::fp8_block_scales(scales, amax);
      Tensor codes = Tensor::empty({n * rows, c.cols}, DType::f8e4m3);
      for (int64_t p = 0; p < n; ++p) {
        Tensor piece_codes = codes.slice(0, p * rows, p * rows + rows);
        kernels::fp8_block_piece_encode(piece_codes, padded.slice(0, p * rows, p * rows + rows), scales, p * rows,
                                        c.rows, c.br, c.bc);
      }
      const std::string where = x.shape().str() + " in " + std::to_string(n) + " pieces";
      EXPECT_EQ(bytes_of(scales), bytes_of(want_scales)) << where;
      EXPECT_EQ(bytes_of(codes.slice(0, 0, c.rows).contiguous()), bytes_of(want_codes)) << where;
      const auto tail = bytes_of(codes.slice(0, c.rows, n * rows).contiguous());
      EXPECT_EQ(std::count(tail.begin(), tail.end(), 0), int64_t(tail.size())) << where << ": padding codes are zero";
    }
  }
}
