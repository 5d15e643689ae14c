#include <gtest/gtest.h>

#include <cmath>

#include "titan/optim/adamw.h"

using namespace titan;

namespace {
struct Two : nn::Module {
  nn::Variable& w = register_parameter("w", {3}, nn::Init::constant(1.0)).var;
  nn::Variable& b = register_parameter("b", {3}, nn::Init::constant(1.0), /*weight_decay=*/false).var;
};
}  // namespace

// Two steps by hand (PyTorch's AdamW formulas) against the optimizer, decay and no-decay groups.
TEST(AdamW, MatchesHandComputedStepsAndGroups) {
  Two m;
  m.init_parameters(0);
  kernels::AdamWParams cfg{0.1f, 0.9f, 0.99f, 1e-8f, 0.5f};
  optim::AdamW opt(m.named_parameters(), cfg);
  const double g[2] = {0.5, -0.25};
  double pw = 1, pb = 1, mw = 0, vw = 0;
  for (int t = 1; t <= 2; ++t) {
    m.w.ensure_grad().fill_(g[t - 1]);
    m.b.ensure_grad().fill_(g[t - 1]);
    opt.step(0.1f);
    mw = 0.9 * mw + 0.1 * g[t - 1];
    vw = 0.99 * vw + 0.01 * g[t - 1] * g[t - 1];
    const double upd = (mw / (1 - std::pow(0.9, t))) / (std::sqrt(vw / (1 - std::pow(0.99, t))) + 1e-8);
    pw -= 0.1 * (0.5 * pw + upd);
    pb -= 0.1 * upd;
  }
  EXPECT_NEAR(m.w.value().at({0}), pw, 1e-6);
  EXPECT_NEAR(m.b.value().at({2}), pb, 1e-6);
  EXPECT_EQ(opt.steps_taken(), 2);
}

TEST(AdamW, StateRoundTripsAndChecksNames) {
  Two m;
  optim::AdamW opt(m.named_parameters(), {});
  m.w.ensure_grad().fill_(1);
  opt.step(0.01f);
  std::map<std::string, Tensor> state;
  for (auto& [k, v] : opt.state_dict()) state[k] = v.clone();
  Two m2;
  optim::AdamW opt2(m2.named_parameters(), {});
  opt2.load_state_dict(state, "ckpt");
  EXPECT_EQ(opt2.steps_taken(), 1);
  EXPECT_EQ(opt2.state_dict()[0].second.at({1}), state["w.exp_avg"].at({1}));
  state.erase("b.exp_avg_sq");
  EXPECT_THROW(opt2.load_state_dict(state, "ckpt"), Error);
}

// A parameter frozen (no gradient) for its first steps then trained gets the same updates as a
// fresh optimizer gives it: its bias corrections count its own updates, not the optimizer's steps.
TEST(AdamW, FrozenParameterStartsItsOwnStepCount) {
  Two m, fresh;
  m.init_parameters(0);
  fresh.init_parameters(0);
  kernels::AdamWParams cfg{0.1f, 0.9f, 0.95f, 1e-8f, 0.1f};
  optim::AdamW opt(m.named_parameters(), cfg), opt_fresh(fresh.named_parameters(), cfg);
  for (int t = 0; t < 3; ++t) {  // warm-up: only w trains, b is frozen
    m.w.ensure_grad().fill_(0.5);
    opt.step(0.1f);
  }
  EXPECT_EQ(opt.param_steps("w"), 3);
  EXPECT_EQ(opt.param_steps("b"), 0);
  const double g[4] = {0.5, -0.25, 1.0, 0.125};
  for (double gt : g) {
    m.b.ensure_grad().fill_(gt);
    fresh.b.ensure_grad().fill_(gt);
    opt.step(0.1f);
    opt_fresh.step(0.1f);
  }
  EXPECT_EQ(opt.steps_taken(), 7);
  EXPECT_EQ(opt.param_steps("b"), 4);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(m.b.value().at({i}), fresh.b.value().at({i}));
  EXPECT_THROW(opt.param_steps("nope"), Error);
}

// Per-parameter counts survive a save and load; a state saved before they existed loads with
// the global count for every parameter.
TEST(AdamW, PerParameterStepsRoundTripAndOldStatesLoad) {
  Two m;
  optim::AdamW opt(m.named_parameters(), {});
  for (int t = 0; t < 2; ++t) {
    m.w.ensure_grad().fill_(1);
    opt.step(0.01f);
  }
  std::map<std::string, Tensor> state;
  for (auto& [k, v] : opt.state_dict()) state[k] = v.clone();
  Two m2;
  optim::AdamW opt2(m2.named_parameters(), {});
  opt2.load_state_dict(state, "ckpt");
  EXPECT_EQ(opt2.param_steps("w"), 2);
  EXPECT_EQ(opt2.param_steps("b"), 0);
  state.erase("w.step");
  state.erase("b.step");
  optim::AdamW opt3(m2.named_parameters(), {});
  opt3.load_state_dict(state, "old ckpt");
  EXPECT_EQ(opt3.steps_taken(), 2);
  EXPECT_EQ(opt3.param_steps("w"), 2);
  EXPECT_EQ(opt3.param_steps("b"), 2);
}
