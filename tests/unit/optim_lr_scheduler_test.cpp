#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "titan/core/error.h"
#include "titan/optim/lr_scheduler.h"

using namespace titan;
using optim::LrDecay;
using optim::LrSchedule;

namespace {

// The factors for steps 1..total_steps.
std::vector<double> factors(const LrSchedule& s) {
  std::vector<double> out;
  for (int64_t step = 1; step <= s.total_steps(); ++step) out.push_back(s.lr_factor(step));
  return out;
}

void expect_factors(const LrSchedule& s, const std::vector<double>& expected) {
  const std::vector<double> got = factors(s);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], expected[i], 1e-12) << "step " << i + 1;
}

}  // namespace

// Expected values below come from TorchTitan's linear_warmup_stable_decay (TOML era) run in
// Python with the same arguments.

TEST(LrSchedule, LinearWarmupStableDecay) {
  // TorchTitan's debug-model schedule: 10 steps, warmup 2, decay over 80% of the run.
  const LrSchedule s(10, 2, 0.8, LrDecay::linear, 0.0);
  EXPECT_EQ(s.warmup_steps(), 2);
  EXPECT_EQ(s.decay_steps(), 8);
  EXPECT_EQ(s.stable_steps(), 1);  // the virtual last step
  expect_factors(s, {0.5, 1.0, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125});
}

TEST(LrSchedule, CosineWithFloorAndNoDecayRatio) {
  // Without decay_ratio the decay starts right after warmup and spans the rest of the run.
  const LrSchedule s(10, 2, std::nullopt, LrDecay::cosine, 0.1);
  EXPECT_EQ(s.decay_steps(), 8);
  expect_factors(s, {0.5, 1.0, 1.0, 0.9657457896300791, 0.8681980515339464, 0.7222075445642904, 0.55,
                     0.3777924554357096, 0.23180194846605365, 0.13425421036992097});
  // The floor is respected on every step: the factor never goes below min_lr_factor.
  for (double f : factors(s)) EXPECT_GE(f, 0.1);
}

TEST(LrSchedule, SqrtWithoutWarmup) {
  const LrSchedule s(10, 0, 0.5, LrDecay::sqrt, 0.0);
  EXPECT_EQ(s.stable_steps(), 6);
  EXPECT_EQ(s.decay_steps(), 5);
  expect_factors(s, {1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5527864045000421, 0.3675444679663241, 0.2254033307585166,
                     0.10557280900008414});
}

TEST(LrSchedule, DecayLengthRoundsHalfToEven) {
  // 10 * 0.25 = 2.5 rounds to 2 (Python's round), not 3.
  const LrSchedule s(10, 3, 0.25, LrDecay::linear, 0.0);
  EXPECT_EQ(s.decay_steps(), 2);
  expect_factors(s, {1.0 / 3, 2.0 / 3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5});
}

TEST(LrSchedule, DecayOverlappingWarmupStartsAfterIt) {
  // warmup 4 + decay round(8) = 12 > 10: the decay is cut to the 6 steps after warmup.
  const LrSchedule s(10, 4, 0.8, LrDecay::linear, 0.0);
  EXPECT_EQ(s.decay_steps(), 6);
  expect_factors(s, {0.25, 0.5, 0.75, 1.0, 1.0, 5.0 / 6, 4.0 / 6, 0.5, 2.0 / 6, 1.0 / 6});
}

TEST(LrSchedule, ZeroDecayRatioStaysAtPeak) {
  const LrSchedule s(5, 0, 0.0, LrDecay::linear, 0.0);
  EXPECT_EQ(s.decay_steps(), 0);
  expect_factors(s, {1.0, 1.0, 1.0, 1.0, 1.0});
}

TEST(LrSchedule, WarmupOverWholeRun) {
  // Warmup equal to the run: the last step reaches the peak and nothing decays.
  const LrSchedule s(4, 4, std::nullopt, LrDecay::cosine, 0.0);
  expect_factors(s, {0.25, 0.5, 0.75, 1.0});
}

TEST(LrSchedule, CosineMidpointAndEnds) {
  // 1 warmup step, then 100 decay steps: progress p = k/100 at decay step k.
  const LrSchedule s(101, 1, std::nullopt, LrDecay::cosine, 0.0);
  EXPECT_DOUBLE_EQ(s.lr_factor(1), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_factor(2), 1.0);  // the virtual step keeps the first decay step at the peak
  EXPECT_NEAR(s.lr_factor(52), 0.5 * (1 + std::cos(std::numbers::pi * 0.5)), 1e-12);
  EXPECT_NEAR(s.lr_factor(101), 0.5 * (1 + std::cos(std::numbers::pi * 0.99)), 1e-12);
}

TEST(LrSchedule, RejectsImpossibleArguments) {
  EXPECT_THROW(LrSchedule(10, 11, std::nullopt, LrDecay::linear, 0.0), Error);
  EXPECT_THROW(LrSchedule(0, 0, std::nullopt, LrDecay::linear, 0.0), Error);
  EXPECT_THROW(LrSchedule(10, 1, 1.5, LrDecay::linear, 0.0), Error);
  EXPECT_THROW(LrSchedule(10, 1, std::nullopt, LrDecay::linear, -0.1), Error);
  const LrSchedule s(10, 1, std::nullopt, LrDecay::linear, 0.0);
  EXPECT_THROW(s.lr_factor(0), Error);
  EXPECT_THROW(s.lr_factor(11), Error);
}

TEST(LrSchedule, DecayNames) {
  for (const LrDecay d : {LrDecay::linear, LrDecay::sqrt, LrDecay::cosine})
    EXPECT_EQ(enum_named<LrDecay>(name_of(d)), d) << name_of(d);
  EXPECT_EQ(name_of(LrDecay::cosine), "cosine");
  EXPECT_EQ(enum_named<LrDecay>("exp"), std::nullopt);
  EXPECT_EQ(enum_named<LrDecay>("Cosine"), std::nullopt);  // exact names; config's hint suggests the spelling
}
