// RoPE tables and apply against independent formulas: DeepSeek-V3's YaRN numbers, Llama 3.1's
// frequency bands, and rotation written as complex multiplication, for both layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "common/kernel_check.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/rope.h"

using namespace titan;
using namespace titan::kernels;

namespace {

RopeConfig deepseek_v3() {
  RopeConfig c;
  c.rope_dims = 64;
  c.theta = 10000;
  c.scaling = RopeScaling::yarn;
  c.factor = 40;
  c.original_max_position_embeddings = 4096;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.mscale = 1;
  c.mscale_all_dim = 1;
  return c;
}

}  // namespace

TEST(Rope, YarnMscale) {
  EXPECT_NEAR(yarn_mscale(40, 1), 1.3688879454113936, 1e-12);  // docs/dsa.md 1.2: m = 1 + 0.1 ln 40
  EXPECT_NEAR(yarn_mscale(40, 0.707), 1 + 0.0707 * std::log(40.0), 1e-12);
  EXPECT_EQ(yarn_mscale(1, 1), 1.0);
  EXPECT_EQ(yarn_mscale(0.5, 1), 1.0);
  EXPECT_EQ(rope_table_magnitude(deepseek_v3()), 1.0);  // mscale == mscale_all_dim
  RopeConfig plain = deepseek_v3();
  plain.mscale_all_dim = 0;
  EXPECT_NEAR(rope_table_magnitude(plain), yarn_mscale(40, 1), 1e-12);
}

// DeepSeek-V3: the ramp runs over pair indices [10, 23]: 64 ln(4096 / (32 * 2pi)) / (2 ln 1e4) = 10.47
// rounds down to 10, and 64 ln(4096 / (2pi)) / (2 ln 1e4) = 22.5 rounds up to 23.
TEST(Rope, YarnFrequenciesMatchDeepSeekV3) {
  const std::vector<double> f = rope_inv_frequencies(deepseek_v3());
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double base = 1.0 / std::pow(10000.0, i / 32.0);
    const double interpolated = std::clamp((i - 10) / 13.0, 0.0, 1.0);  // share divided by the factor
    const double want = base * (1 - interpolated) + base / 40 * interpolated;
    EXPECT_NEAR(f[size_t(i)] / want, 1.0, 1e-12) << "pair " << i;
  }
  EXPECT_NEAR(f[10] * std::pow(10000.0, 10 / 32.0), 1.0, 1e-12);       // last pair kept
  EXPECT_NEAR(f[23] * std::pow(10000.0, 23 / 32.0) * 40, 1.0, 1e-12);  // first pair fully divided
}

// Llama 3.1 (theta 5e5, 128 dims, factor 8, bands at wavelengths 8192/4 and 8192/1): judged by
// rotations over the original context, r = 8192 f / 2pi: r > 4 keeps f, r < 1 gives f / 8, and
// in between f is blended with weight (r - 1) / 3 on the original.
TEST(Rope, Llama3FrequencyBands) {
  RopeConfig c;
  c.rope_dims = 128;
  c.theta = 500000;
  c.scaling = RopeScaling::llama3;
  c.factor = 8;
  c.original_max_position_embeddings = 8192;
  const std::vector<double> f = rope_inv_frequencies(c);
  int kept = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -i / 64.0);
    const double r = 8192 * base / (2 * std::numbers::pi);
    double want = base;
    if (r < 1) {
      want = base / 8, ++divided;
    } else if (r <= 4) {
      const double w = (r - 1) / 3;
      want = w * base + (1 - w) * base / 8, ++blended;
    } else {
      ++kept;
    }
    EXPECT_NEAR(f[size_t(i)] / want, 1.0, 1e-12) << "pair " << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, TablesHoldCosSinOfPositionTimesFrequency) {
  RopeConfig c = deepseek_v3();
  c.mscale_all_dim = 0.5;  // magnitude != 1
  const RopeTables t = rope_tables(c, 20000);
  const std::vector<double> f = rope_inv_frequencies(c);
  const double m = rope_table_magnitude(c);
  for (int64_t p : {0, 1, 4095, 19999}) {
    for (int64_t i : {0, 7, 31}) {
      EXPECT_NEAR(t.cos.at({p, i}), m * std::cos(double(p) * f[size_t(i)]), 1e-7);
      EXPECT_NEAR(t.sin.at({p, i}), m * std::sin(double(p) * f[size_t(i)]), 1e-7);
    }
  }
}

TEST(Rope, InvalidConfigsAreRejected) {
  RopeConfig c;
  c.rope_dims = 7;
  EXPECT_THROW(rope_inv_frequencies(c), Error);
  c = deepseek_v3();
  c.original_max_position_embeddings = 0;
  EXPECT_THROW(rope_inv_frequencies(c), Error);
}

// Rotation as complex multiplication: pair (a, b) is z = a + ib and becomes z e^{i p f}.
class RopeApply : public ::testing::TestWithParam<std::tuple<RopeLayout, KernelBackend, DType>> {};

TEST_P(RopeApply, MatchesComplexRotation) {
  const auto [layout, backend, dtype] = GetParam();
  set_kernel_backend(backend);
  const int64_t B = 2, S = 5, H = 3, Dh = 24, R = 16, offset = 4;
  RopeConfig c = deepseek_v3();
  c.rope_dims = R;
  c.original_max_position_embeddings = 8;
  const RopeTables t = rope_tables(c, 64);
  const std::vector<double> f = rope_inv_frequencies(c);
  Tensor positions = Tensor::empty({B, S}, DType::i32);
  const int32_t pos[B * S] = {0, 1, 2, 3, 4, 60, 61, 62, 63, 0};  // a second packed sequence restarting at 0
  for (int i = 0; i < B * S; ++i) positions.data<int32_t>()[i] = pos[i];
  const Tensor x = test::random_tensor({B, S, H, Dh}, dtype, 3, "x");
  Tensor y = Tensor::empty(x.shape(), dtype);
  rope_forward(y, x, t, positions, layout, offset);
  const std::vector<double> xv = test::to_doubles(x), yv = test::to_doubles(y);
  const double tol = dtype == DType::f32 ? 2e-6 : 1.6e-2;
  for (int64_t n = 0; n < B * S; ++n) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = (n * H + h) * Dh;
      for (int64_t d = 0; d < Dh; ++d) {
        if (d < offset || d >= offset + R) {
          EXPECT_EQ(yv[size_t(base + d)], xv[size_t(base + d)]);
        }
      }
      for (int64_t i = 0; i < R / 2; ++i) {
        const int64_t a = layout == RopeLayout::interleaved ? offset + 2 * i : offset + i;
        const int64_t b = layout == RopeLayout::interleaved ? offset + 2 * i + 1 : offset + i + R / 2;
        const std::complex<double> z(xv[size_t(base + a)], xv[size_t(base + b)]);
        const std::complex<double> w = z * std::polar(1.0, pos[n] * f[size_t(i)]);
        EXPECT_NEAR(yv[size_t(base + a)], w.real(), tol) << "token " << n << " pair " << i;
        EXPECT_NEAR(yv[size_t(base + b)], w.imag(), tol) << "token " << n << " pair " << i;
      }
    }
  }
  // Backward is the inverse rotation: dx = 0 + RoPE^T(y) gives x back.
  Tensor dx = Tensor::zeros(x.shape(), DType::f32);
  rope_backward(dx, y.to(DType::f32), t, positions, layout, offset);
  const test::ErrorStats e = test::compare(test::to_doubles(dx), xv, dtype == DType::f32 ? 1e-5 : 2e-2, 0);
  EXPECT_LE(e.max_scaled, 1.0) << "max_abs " << e.max_abs;
  set_kernel_backend(KernelBackend::fast);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RopeApply,
                         ::testing::Combine(::testing::Values(RopeLayout::interleaved, RopeLayout::rotate_half),
                                            ::testing::Values(KernelBackend::fast, KernelBackend::reference),
                                            ::testing::Values(DType::f32, DType::bf16)));

TEST(Rope, PositionOutsideTablesNamesTheToken) {
  RopeConfig c;
  c.rope_dims = 8;
  const RopeTables t = rope_tables(c, 16);
  const Tensor x = Tensor::zeros({3, 1, 8}, DType::f32);
  Tensor y = Tensor::empty(x.shape(), DType::f32);
  Tensor positions = Tensor::zeros({3}, DType::i32);
  positions.data<int32_t>()[2] = 16;
  try {
    rope_forward(y, x, t, positions, RopeLayout::interleaved);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("position 16 of token 2"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
}
