#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "titan/train/generate.h"

using namespace titan;
using namespace titan::train;

TEST(Sampling, GreedyTopKTopPAndSeeds) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  Generator g(1);
  SamplingOptions greedy{0.0, 0, 1.0};
  EXPECT_EQ(sample_token(logits, greedy, g), 1);  // ties: the lower id
  // top-k 2 keeps ids 1 and 3 only.
  SamplingOptions k2{1.0, 2, 1.0};
  std::map<int32_t, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[sample_token(logits, k2, g)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_NEAR(seen[1] / 2000.0, 0.5, 0.05);
  // p(1) = p(3) ~ 0.39: a nucleus of 0.3 is reached by the first candidate alone, id 1.
  SamplingOptions p03{1.0, 0, 0.3};
  for (int i = 0; i < 200; ++i) ASSERT_EQ(sample_token(logits, p03, g), 1);
  // Temperature sharpens: at 0.1 the two top tokens take almost all the mass.
  SamplingOptions cold{0.1, 0, 1.0};
  for (int i = 0; i < 200; ++i) {
    const int32_t t = sample_token(logits, cold, g);
    ASSERT_TRUE(t == 1 || t == 3);
  }
  // Same seed, same draws.
  Generator a(7), b(7);
  SamplingOptions any{1.0, 0, 1.0};
  for (int i = 0; i < 50; ++i) ASSERT_EQ(sample_token(logits, any, a), sample_token(logits, any, b));
}
