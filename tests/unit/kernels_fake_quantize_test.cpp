// kernels/quantize.h's fake quantization (quantize and dequantize in one pass, MX also down the
// columns): the reference is the composition of the reference quantizer and dequantizer (checked
// here against hand-worked values and the transposed quantization), and the fast kernels must
// equal it bit for bit at every ISA level this CPU has, with the codes and scales they write, on
// awkward shapes and values: ties, saturation, subnormals, NaN / infinity, zero blocks, scale
// extremes, ragged last blocks. In place (out = x) gives the same bits.
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

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data_ptr());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

using test::on_reference;

// Values over 2^-30 .. 2^30, both signs, some zeros; then the awkward ones planted: a zero block
// (rows 0..1, the first 40 columns when they exist), ties and saturation, f32 subnormals, NaN and
// infinity in their own blocks, a tiny block whose FP8 scale amax / 448 would underflow to 0 and a
// huge one near FLT_MAX.
Tensor awkward(int64_t rows, int64_t cols, uint64_t seed) {
  Tensor t = Tensor::empty({rows, cols}, DType::f32);
  Generator g(seed, "fake_quantize");
  float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double u = g.next_uniform(), e = 60 * g.next_uniform() - 30;
    v[i] = u < 0.05 ? 0.0f : float((u < 0.5 ? -1 : 1) * std::exp2(e) * (1 + g.next_uniform()));
  }
  auto at = [&](int64_t r, int64_t c, float x) {
    if (r < rows && c < cols) v[r * cols + c] = x;
  };
  for (int64_t r = 0; r < std::min<int64_t>(rows, 2); ++r)
    for (int64_t c = 0; c < std::min<int64_t>(cols, 40); ++c) v[r * cols + c] = 0;
  const float mixed[] = {448, 1.0625f, 1.1875f, 500, -0.0f, 2.5f, 0.25f, 7, -1.5f, std::ldexp(1.0f, -140)};
  for (int64_t c = 0; c < 40; ++c) at(2, c, c < 10 ? mixed[c] : 0.0f);  // row 2's first MX block: scale 2^0
  at(3, 0, kNaN), at(3, 1, -kInf), at(5, 7, kInf);
  for (int64_t c = 0; c < std::min<int64_t>(cols, 40); ++c) {  // rows 6, 7: f32 subnormals and a 0
    at(6, c, c == 3 ? 0.0f : std::ldexp(float(c % 5 + 1), -149));
    at(7, c, (c % 2 ? -1 : 1) * std::numeric_limits<float>::max() / float(c + 1));
  }
  return t;
}

struct Fake {
  Tensor out, codes, scales;
};

Fake mx_fake(const Tensor& x, DType element, bool along_rows, bool with_codes) {
  Fake f{Tensor::empty(x.shape(), DType::f32), {}, {}};
  if (with_codes) {
    f.codes = Tensor::empty(x.shape(), element), f.scales = Tensor::empty({x.size(0), (x.size(1) + 31) / 32}, DType::e8m0);
    kernels::mx_fake_quantize(f.out, f.codes, f.scales, x);
  } else {
    kernels::mx_fake_quantize(f.out, x, element, along_rows);
  }
  return f;
}

Fake fp8_fake(const Tensor& x, int64_t br, int64_t bc, ScaleRule rule, bool with_codes) {
  Fake f{Tensor::empty(x.shape(), DType::f32), {}, {}};
  if (with_codes) {
    f.codes = Tensor::empty(x.shape(), DType::f8e4m3);
    f.scales = Tensor::empty({(x.size(0) + br - 1) / br, (x.size(1) + bc - 1) / bc}, DType::f32);
    kernels::fp8_block_fake_quantize(f.out, f.codes, f.scales, x, br, bc, rule);
  } else {
    kernels::fp8_block_fake_quantize(f.out, x, br, bc, rule);
  }
  return f;
}

// The codes read back by the plain dequantizer (FP8 tiles br x bc; br = 0: MX).
Tensor dequantized(const Fake& f, int64_t br, int64_t bc) {
  Tensor out = Tensor::empty(f.out.shape(), DType::f32);
  if (br == 0)
    kernels::mx_dequantize(out, f.codes, f.scales);
  else
    kernels::fp8_block_dequantize(out, f.codes, f.scales, br, bc);
  return out;
}

// Same bits; with codes, the same codes and scales, and the dequantizers (fast and reference)
// read them back alike.
void expect_same(const Fake& got, const Fake& want, const std::string& where, int64_t br = 0, int64_t bc = 0) {
  EXPECT_EQ(bytes_of(got.out), bytes_of(want.out)) << "values " << where;
  if (want.codes.defined()) {
    EXPECT_EQ(bytes_of(got.codes), bytes_of(want.codes)) << "codes " << where;
    EXPECT_EQ(bytes_of(got.scales), bytes_of(want.scales)) << "scales " << where;
    EXPECT_EQ(bytes_of(dequantized(got, br, bc)), bytes_of(on_reference([&] { return dequantized(want, br, bc); })))
        << "dequantized " << where;
  }
}

}  // namespace

TEST(FakeQuantize, FastKernelsEqualTheReferenceBitForBitAtEveryIsaLevel) {
  struct Shape2 {
    int64_t rows, cols;
  };
  // Ragged everywhere: 33 rows (a 32-row MX block down the columns and one of 1), 200 = 6 x 32 + 8,
  // 130 x 257 (ragged 128-tiles both ways), 1 x 2, 64 x 70 (a column chunk and a ragged one).
  const std::vector<Shape2> shapes = {{33, 200}, {1, 2}, {8, 34}, {130, 257}, {64, 70}, {256, 128}};
  for (const Shape2& sh : shapes) {
    const Tensor x = awkward(sh.rows, sh.cols, uint64_t(sh.rows * 1000 + sh.cols));
    const Tensor x4 = x.slice(1, 0, sh.cols - sh.cols % 2).contiguous();    // MXFP4 rows: even length
    const Tensor x4c = x.slice(0, 0, sh.rows - sh.rows % 2).contiguous();   // MXFP4 columns: even height
    const std::vector<std::pair<int64_t, int64_t>> tiles = {{1, 128}, {128, 1}, {128, 128}, {3, 5}, {2, 16}, {1, 7}};
    test::for_each_isa([&](CpuCapability isa) {
      const std::string where = x.shape().str() + " at " + test::isa_label(isa);
      for (const bool rows : {true, false}) {
        const std::string dir = rows ? " along rows " : " along columns ";
        expect_same(mx_fake(x, DType::f8e4m3, rows, false),
                    on_reference([&] { return mx_fake(x, DType::f8e4m3, rows, false); }), "MXFP8" + dir + where);
        if (x4c.size(0) > 0) {
          const Tensor& y = rows ? x4 : x4c;
          expect_same(mx_fake(y, DType::f4e2m1, rows, false),
                      on_reference([&] { return mx_fake(y, DType::f4e2m1, rows, false); }), "MXFP4" + dir + where);
        }
      }
      expect_same(mx_fake(x, DType::f8e4m3, true, true), on_reference([&] { return mx_fake(x, DType::f8e4m3, true, true); }),
                  "MXFP8 with codes " + where);
      expect_same(mx_fake(x4, DType::f4e2m1, true, true),
                  on_reference([&] { return mx_fake(x4, DType::f4e2m1, true, true); }), "MXFP4 with codes " + where);
      for (const auto& [br, bc] : tiles)
        for (const ScaleRule rule : {ScaleRule::amax, ScaleRule::pow2})
          for (const bool codes : {false, true})
            expect_same(fp8_fake(x, br, bc, rule, codes), on_reference([&] { return fp8_fake(x, br, bc, rule, codes); }),
                        "FP8 " + std::to_string(br) + "x" + std::to_string(bc) + (codes ? " with codes " : " ") + where, br,
                        bc);
    });
  }
}

TEST(FakeQuantize, ReferenceIsTheQuantizerThenTheDequantizer) {
  const Tensor x = awkward(40, 64, 7);
  // FP8 1 x 128 / 128 x 1 and MXFP8 rows: the composition (NaNs compared as NaN).
  Tensor codes = Tensor::empty(x.shape(), DType::f8e4m3), scales = Tensor::empty({40, 1}, DType::f32);
  Tensor back = Tensor::empty(x.shape(), DType::f32);
  on_reference([&] {
    kernels::fp8_block_quantize(codes, scales, x, 1, 128);
    kernels::fp8_block_dequantize(back, codes, scales, 1, 128);
    return 0;
  });
  const Fake f = on_reference([&] { return fp8_fake(x, 1, 128, ScaleRule::amax, false); });
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float a = f.out.data<float>()[i], b = back.data<float>()[i];
    EXPECT_TRUE(std::isnan(b) ? std::isnan(a) : std::memcmp(&a, &b, 4) == 0) << i;
  }
  // MX along the columns is the transpose's rows, turned back; at the tiny row 6, values survive.
  const Tensor xt = x.transpose(0, 1).contiguous();
  const Fake down = on_reference([&] { return mx_fake(x, DType::f8e4m3, false, false); });
  const Fake across = on_reference([&] { return mx_fake(xt, DType::f8e4m3, true, false); });
  EXPECT_EQ(bytes_of(down.out), bytes_of(across.out.transpose(0, 1).contiguous()));
  // Hand-worked: row 2's first block (448, 1 + 1/16, 1 + 3/16, 500, -0, ..., zeros) has amax 500,
  // floor(log2 500) - 8 = 0: scale 2^0.
  const Fake r = on_reference([&] { return mx_fake(x, DType::f8e4m3, true, false); });
  const float* row2 = r.out.data<float>() + 2 * 64;
  EXPECT_EQ(row2[1], 1.0f);    // tie to even
  EXPECT_EQ(row2[2], 1.25f);   // tie to even
  EXPECT_EQ(row2[3], 448.0f);  // 500 saturates
  EXPECT_TRUE(row2[4] == 0 && std::signbit(row2[4]));
  // A NaN block comes back as the default quiet NaN (its bits, whatever the input's sign).
  const float* row3 = r.out.data<float>() + 3 * 64;
  const float q = kNaN;
  EXPECT_EQ(std::memcmp(&row3[1], &q, 4), 0);
}

TEST(FakeQuantize, InPlaceGivesTheSameBits) {
  const Tensor x = awkward(130, 96, 3);
  for (const bool rows : {true, false}) {
    Tensor y = x.clone();
    kernels::mx_fake_quantize(y, y, DType::f8e4m3, rows);
    EXPECT_EQ(bytes_of(y), bytes_of(mx_fake(x, DType::f8e4m3, rows, false).out)) << rows;
    Tensor z = x.clone();
    kernels::fp8_block_fake_quantize(z, z, rows ? 1 : 128, rows ? 128 : 1);
    EXPECT_EQ(bytes_of(z), bytes_of(fp8_fake(x, rows ? 1 : 128, rows ? 128 : 1, ScaleRule::amax, false).out)) << rows;
  }
}

TEST(FakeQuantize, BadArgumentsAreRefusedWithTheFix) {
  const Tensor x = Tensor::zeros({3, 32}, DType::f32);
  Tensor out = Tensor::empty({3, 32}, DType::f32), small = Tensor::empty({3, 16}, DType::f32);
  EXPECT_NE(test::error_of([&] { kernels::mx_fake_quantize(out, x, DType::f4e2m1, false); }).find("even run"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::mx_fake_quantize(out, x, DType::bf16, true); }).find("f8e4m3"), std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::mx_fake_quantize(small, x, DType::f8e4m3, true); }).find("[3, 32]"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { kernels::fp8_block_fake_quantize(out, x, 0, 128); }).find("positive block"),
            std::string::npos);
}

TEST(FakeQuantize, ATileOfTinyValuesKeepsItsZerosAndStaysFinite) {
  // amax = 5 x 2^-149 (and, in a second tile, 2^-130, normal-range work under flushed denormals):
  // amax / 448 rounds to 0 in f32 (or is flushed); the scale is held at 2^-126 instead, so the zero
  // stays 0 (not 0 / 0) and every value is finite, on both backends and both scale rules.
  std::vector<float> v(16, std::ldexp(5.0f, -149));
  v[3] = 0, v[5] = -std::ldexp(1.0f, -149);
  for (int i = 8; i < 16; ++i) v[size_t(i)] = i == 11 ? 0.0f : std::ldexp(1.0f + float(i) / 16, -130);
  Tensor x = Tensor::empty({2, 8}, DType::f32);
  std::memcpy(x.data<float>(), v.data(), 64);
  for (const ScaleRule rule : {ScaleRule::amax, ScaleRule::pow2}) {
    const Fake fast = fp8_fake(x, 1, 8, rule, true), ref = on_reference([&] { return fp8_fake(x, 1, 8, rule, true); });
    EXPECT_EQ(ref.scales.data<float>()[0], std::ldexp(1.0f, -126));
    EXPECT_EQ(bytes_of(fast.out), bytes_of(ref.out));
    for (const Fake* f : {&fast, &ref}) {
      for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isfinite(f->out.data<float>()[i])) << i;
      EXPECT_EQ(f->out.data<float>()[3], 0.0f);
      EXPECT_EQ(f->out.data<float>()[11], 0.0f);
    }
  }
}
