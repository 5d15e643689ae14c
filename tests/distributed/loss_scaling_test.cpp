// Dynamic loss scaling and the gradient reductions' wire type (training.loss_scaling,
// training.gradient_sync_dtype; docs/precision.md), on llama3 debug under FSDP over 2 ranks.
#include "distributed/common.h"

#include <algorithm>
#include <cmath>

#include "common/error_of.h"
#include "titan/checkpoint/checkpoint.h"

using namespace titan;
using namespace titan::test;

namespace {

class LossScaling : public TrainingSuite<LossScaling> {
 public:
  static constexpr const char* kTag = "loss_scaling";

 protected:
  static train::JobConfig config(const std::string& name, int steps, std::vector<std::string> extra = {}) {
    std::string toml = base_toml("llama3", data(), root() / name, steps);
    toml += "[parallelism]\ndata_parallel_shard_degree = -1\n";
    train::JobConfig cfg = train::parse_config(toml, name + ".toml", extra);
    cfg.training.global_batch_size = 4;
    cfg.training.local_batch_size = 4 / world().size();
    return cfg;
  }
  // Each train line of a run's metrics.jsonl, by step.
  static std::map<int64_t, nlohmann::json> lines(const std::string& name) {
    std::map<int64_t, nlohmann::json> out;
    std::ifstream f(root() / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (auto j = nlohmann::json::parse(line); j["kind"] == "train") out[j["step"].get<int64_t>()] = j;
    return out;
  }
  static bool said(const std::string& name, const std::string& needle) {
    std::ifstream f(root() / name / "metrics.jsonl");
    for (std::string line; std::getline(f, line);)
      if (const auto j = nlohmann::json::parse(line); j["kind"] == "event" && j["text"].get<std::string>().find(needle) != std::string::npos)
        return true;
    return false;
  }
};

// Rank 1 alone gets a NaN gradient at step 5: every rank skips that one update and halves the
// scale; the steps before match an unscaled run (a power-of-two scale is exact in f32), the step
// after does not (an update is missing). The scale and the skip count are logged with every step,
// saved in the checkpoint's train state, and a resumed run continues from them.
TEST_F(LossScaling, AnOverflowOnOneRankSkipsOneStepAndHalvesTheScale) {
  if (world().size() != 2) GTEST_SKIP() << "2 ranks, rank 1 overflowing";
  const std::vector<std::string> scaled = {"--training.loss_scaling=dynamic", "--training.loss_scale_init=1024",
                                           "--fault.inject_nonfinite_at_step=5", "--fault.inject_rank=1",
                                           "--checkpoint.enable=true", "--checkpoint.interval=10",
                                           "--checkpoint.last_save_model_only=false"};
  const auto plain = train_on(config("plain", 12), world());
  train_on(config("scaled", 12, scaled), world());
  const auto s = lines("scaled");
  ASSERT_EQ(s.size(), 12u);
  for (int64_t step = 1; step <= 5; ++step)
    EXPECT_NEAR(s.at(step)["loss"].get<double>(), plain[size_t(step - 1)], 1e-6 * plain[size_t(step - 1)]) << step;
  EXPECT_GT(std::abs(s.at(6)["loss"].get<double>() - plain[5]), 1e-6) << "step 5's update was not skipped";
  for (int64_t step = 1; step <= 12; ++step) {
    EXPECT_EQ(s.at(step)["loss_scale"].get<double>(), step < 5 ? 1024 : 512) << step;
    EXPECT_EQ(s.at(step)["skipped_steps"].get<double>(), step < 5 ? 0 : 1) << step;
  }
  EXPECT_TRUE(said("scaled", "loss scale 1024 -> 512 (1 skipped so far)")) << "no event for the overflow";
  EXPECT_TRUE(said("scaled", "on rank 1 (the gradient of")) << "the event does not name rank 1";
  const nlohmann::json state = checkpoint::load_train_state(root() / "scaled" / "checkpoint" / "step-10");
  EXPECT_EQ(state["loss_scaler"]["scale"].get<double>(), 512);
  EXPECT_EQ(state["loss_scaler"]["skipped_steps"].get<int64_t>(), 1);
  EXPECT_EQ(state["loss_scaler"]["growth_tracker"].get<int64_t>(), 5);  // steps 6..10 were finite
  // Resumed from step 12 (the final save) for 2 more steps: the scale is the checkpoint's.
  train_on(config("scaled", 14, scaled), world());
  const auto r = lines("scaled");
  EXPECT_EQ(r.at(14)["loss_scale"].get<double>(), 512);
  EXPECT_EQ(r.at(14)["skipped_steps"].get<double>(), 1);
}

// The scale grows by loss_scale_growth_factor after loss_scale_growth_interval finite steps.
TEST_F(LossScaling, TheScaleGrowsAfterTheInterval) {
  if (world().size() != 2) GTEST_SKIP() << "2 ranks";
  train_on(config("growth", 7, {"--training.loss_scaling=dynamic", "--training.loss_scale_init=8",
                                "--training.loss_scale_growth_interval=3"}),
           world());
  const auto g = lines("growth");
  const double want[] = {8, 8, 16, 16, 16, 32, 32};  // logged after each step's update
  for (int64_t step = 1; step <= 7; ++step) EXPECT_EQ(g.at(step)["loss_scale"].get<double>(), want[step - 1]) << step;
}

// Gradients reduce-scattered in bf16 or f16 under FSDP 2 (summed in f32 inside the reduction)
// train close to the f32 reduction; f32 itself is the unconverted path, to the last bit.
TEST_F(LossScaling, GradientSyncDtypeUnderFsdp) {
  if (world().size() != 2) GTEST_SKIP() << "FSDP 2";
  const auto f32 = train_on(config("sync_f32", 20), world());
  EXPECT_EQ(f32, train_on(config("sync_f32_named", 20, {"--training.gradient_sync_dtype=float32"}), world()));
  for (const std::string dtype : {"bfloat16", "float16"}) {
    const auto half = train_on(config("sync_" + dtype, 20, {"--training.gradient_sync_dtype=" + dtype}), world());
    ASSERT_EQ(half.size(), f32.size());
    double worst = 0;
    for (size_t i = 0; i < f32.size(); ++i) worst = std::max(worst, std::abs(half[i] - f32[i]) / f32[i]);
    if (world().rank() == 0) std::printf("gradient_sync_dtype %s: worst relative loss difference %.3g over 20 steps\n", dtype.c_str(), worst);
    EXPECT_LT(worst, 1e-3) << dtype;
    EXPECT_GT(worst, 0) << dtype << ": the reduction did not round";
  }
}

// fp16 mixed precision under FSDP 2 (f16 weight copies gathered, gradients reduce-scattered in
// f16: seed 003's recipe) and DDP 2 (bf16 all-reduce) train as fp16 on one rank does.
TEST_F(LossScaling, Fp16UnderFsdpAndDdp) {
  if (world().size() != 2) GTEST_SKIP() << "FSDP 2 and DDP 2";
  const std::string fp16 = "--training.mixed_precision_param=float16";
  const auto one = reference_on_rank0(layout_config("llama3", data(), root() / "fp16_one", {1, 1}, {fp16}));
  const auto worst = [&](const std::vector<double>& run) {
    double w = 0;
    for (size_t i = 0; i < one.size(); ++i) w = std::max(w, std::abs(run[i] - one[i]) / one[i]);
    return w;
  };
  const auto fsdp = train_on(layout_config("llama3", data(), root() / "fp16_fsdp", {1, 2},
                                           {fp16, "--training.gradient_sync_dtype=float16"}), world());
  const auto ddp = train_on(layout_config("llama3", data(), root() / "fp16_ddp", {2, 1},
                                          {fp16, "--training.gradient_sync_dtype=bfloat16"}), world());
  ASSERT_EQ(fsdp.size(), one.size());
  ASSERT_EQ(ddp.size(), one.size());
  if (world().rank() == 0)
    std::printf("fp16 against its 1-rank run over 20 steps: FSDP 2 with f16 reductions %.3g, DDP 2 with bf16 "
                "reductions %.3g (worst relative loss difference)\n", worst(fsdp), worst(ddp));
  EXPECT_LT(worst(fsdp), 1e-3);
  EXPECT_LT(worst(ddp), 1e-3);
}

// Bad values name the key and say what to do.
TEST_F(LossScaling, BadValuesAreClearErrors) {
  if (world().size() != 2) GTEST_SKIP() << "config checks run once";
  const auto error = [&](std::vector<std::string> extra) {
    return error_of([&] { config("bad", 4, std::move(extra)); });
  };
  EXPECT_NE(error({"--training.loss_scale_backoff_factor=1"}).find("training.loss_scale_backoff_factor"), std::string::npos);
  EXPECT_NE(error({"--training.loss_scale_growth_factor=0.5"}).find("training.loss_scale_growth_factor"), std::string::npos);
  EXPECT_NE(error({"--training.loss_scale_growth_interval=0"}).find("training.loss_scale_growth_interval"), std::string::npos);
  EXPECT_NE(error({"--training.gradient_sync_dtype=float8"}).find("training.gradient_sync_dtype"), std::string::npos);
  EXPECT_NE(error({"--training.loss_scaling=static"}).find("training.loss_scaling"), std::string::npos);
  const std::string min = error({"--training.loss_scaling=dynamic", "--training.loss_scale_min=4096", "--training.loss_scale_init=1024"});
  EXPECT_NE(min.find("loss_scale_min"), std::string::npos) << min;
  EXPECT_NE(min.find("loss_scale_init"), std::string::npos) << min;
  const std::string model = error_of([&] {
    train::parse_config(base_toml("deepseek_v32", data(), root() / "bad", 4), "bad.toml",
                        {"--training.mixed_precision_param=float16"});
  });
  EXPECT_NE(model.find("it is for: llama3"), std::string::npos) << model;
}

}  // namespace
