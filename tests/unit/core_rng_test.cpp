#include <gtest/gtest.h>

#include <cmath>

#include "titan/core/rng.h"
#include "titan/core/tensor.h"

using namespace titan;

TEST(Rng, PhiloxKnownAnswer) {
  // Random123's kat_vectors for philox4x32_10: counter = key = 0.
  const auto r = philox4x32(0, 0, 0);
  EXPECT_EQ(r[0], 0x6627e8d5u);
  EXPECT_EQ(r[1], 0xe169c58du);
  EXPECT_EQ(r[2], 0xbc57ac4cu);
  EXPECT_EQ(r[3], 0x9b00dbd8u);
  // counter = key = all ones.
  const auto s = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(s[0], 0x408f276du);
  EXPECT_EQ(s[1], 0x41c83b0eu);
  EXPECT_EQ(s[2], 0xa20bc7c6u);
  EXPECT_EQ(s[3], 0x6d5451fdu);
}

TEST(Rng, ElementDependsOnlyOnSeedNameIndex) {
  Tensor full = Tensor::empty({8, 6}, DType::f32);
  init_normal(full, 42, "layers.0.w", 0, 1);
  // The same tensor built as two column shards gets the same values.
  for (int part = 0; part < 2; ++part) {
    Tensor shard = Tensor::empty({8, 3}, DType::f32);
    GlobalSlice slice{{8, 6}, {0, 3 * part}};
    init_normal(shard, 42, "layers.0.w", 0, 1, &slice);
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 3; ++c) ASSERT_EQ(shard.at({r, c}), full.at({r, 3 * part + c}));
  }
  Tensor other = Tensor::empty({8, 6}, DType::f32);
  init_normal(other, 42, "layers.1.w", 0, 1);
  EXPECT_NE(other.at({0, 0}), full.at({0, 0}));
}

TEST(Rng, DistributionMoments) {
  const int64_t n = 200000;
  Tensor t = Tensor::empty({n}, DType::f32);
  auto moments = [&](double& mean, double& var) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; ++i) s += t.data<float>()[i];
    mean = s / n;
    for (int64_t i = 0; i < n; ++i) s2 += std::pow(t.data<float>()[i] - mean, 2);
    var = s2 / n;
  };
  double m, v;
  init_normal(t, 1, "n", 2.0, 3.0);
  moments(m, v);
  EXPECT_NEAR(m, 2.0, 0.03);
  EXPECT_NEAR(v, 9.0, 0.15);
  init_uniform(t, 1, "u", -1, 3);
  moments(m, v);
  EXPECT_NEAR(m, 1.0, 0.02);
  EXPECT_NEAR(v, 16.0 / 12, 0.02);
  init_trunc_normal(t, 1, "t", 0, 1, -2, 2);
  moments(m, v);
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::fabs(t.data<float>()[i]) <= 2.0f);
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 0.7737, 0.01);  // variance of N(0,1) truncated to [-2, 2]
}

TEST(Rng, NormalQuantileInvertsCdf) {
  for (double p : {1e-12, 1e-5, 0.01, 0.3, 0.5, 0.77, 0.999, 1 - 1e-9}) {
    const double x = normal_quantile(p);
    EXPECT_NEAR(0.5 * std::erfc(-x / std::sqrt(2.0)), p, 1e-14 + 1e-12 * p);
  }
}

TEST(Rng, GeneratorStateRoundTrips) {
  Generator g(7);
  for (int i = 0; i < 10; ++i) g.next_u32();
  Generator h(0);
  h.set_state(g.key(), g.offset());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(g.next_u64(), h.next_u64());
  for (int i = 0; i < 1000; ++i) EXPECT_LT(g.next_below(13), 13u);
}
