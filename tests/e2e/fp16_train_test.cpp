// fp16 mixed precision (training.mixed_precision_param = "float16", dynamic loss scaling on) trains
// llama3 debug as f32 does: after 200 steps its validation loss (the same held-out batches) and
// its training loss (the mean of the last 10 steps: one step's is one batch's, noisy this low)
// are within 1% of f32's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/byte_dataset.h"
#include "common/run_toml.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

std::vector<nlohmann::json> lines_of(const fs::path& run, const std::string& kind = "train") {
  std::vector<nlohmann::json> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    if (auto j = nlohmann::json::parse(line); j["kind"] == kind) out.push_back(j);
  return out;
}

// The mean loss of the last n steps (one step's loss is one batch's: the mean is steadier).
double tail_mean(const std::vector<nlohmann::json>& lines, size_t n) {
  double sum = 0;
  for (size_t i = lines.size() - n; i < lines.size(); ++i) sum += lines[i]["loss"].get<double>();
  return sum / double(n);
}

}  // namespace

TEST(Fp16E2E, TwoHundredStepsMatchF32WithinOnePercent) {
  const fs::path root = fs::temp_directory_path() / ("titan_fp16_e2e_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = test::prepare_templated_dataset(root);
  const auto run = [&](const std::string& name, const std::string& dtype) {
    std::string toml = test::base_toml("llama3", data, root / name, 200);
    train::JobConfig c = train::parse_config(toml, name + ".toml",
                                             {"--training.mixed_precision_param=" + dtype, "--training.seq_len=32",
                                              "--training.local_batch_size=4", "--lr_scheduler.warmup_steps=20",
                                              "--validation.enable=true", "--validation.freq=200",
                                              "--validation.seq_len=32", "--validation.local_batch_size=4",
                                              "--validation.steps=8"});
    return train::Trainer(c, "fp16_train_test").train().last_val_loss;
  };
  const double val32 = run("f32", "float32"), val16 = run("f16", "float16");
  const auto f32 = lines_of(root / "f32"), f16 = lines_of(root / "f16");
  ASSERT_EQ(f32.size(), 200u);
  ASSERT_EQ(f16.size(), 200u);
  const double a = tail_mean(f32, 10), b = tail_mean(f16, 10);
  const double final_gap = std::abs(f16.back()["loss"].get<double>() - f32.back()["loss"].get<double>()) /
                           f32.back()["loss"].get<double>();
  const double val_gap = std::abs(val16 - val32) / val32;
  std::printf("llama3 debug, 200 steps: validation loss f32 %.5f, fp16 %.5f: %.3f%% apart; training loss (mean "
              "of the last 10 steps) f32 %.5f, fp16 %.5f: %.3f%% apart (step 200 alone: %.2f%%); fp16 loss scale %g, "
              "%g steps skipped\n",
              val32, val16, 100 * val_gap, a, b, 100 * std::abs(b - a) / a, 100 * final_gap,
              f16.back()["loss_scale"].get<double>(), f16.back()["skipped_steps"].get<double>());
  EXPECT_LT(val_gap, 0.01);
  EXPECT_LT(std::abs(b - a) / a, 0.01);
  EXPECT_LT(b, f16.front()["loss"].get<double>() * 0.8) << "fp16 did not learn";
  // The f16 rounding is real: the first step's loss already differs from f32's.
  EXPECT_NE(f16.front()["loss"].get<double>(), f32.front()["loss"].get<double>());
  EXPECT_TRUE(f16.back().contains("loss_scale")) << "fp16 turns dynamic loss scaling on";
  EXPECT_FALSE(f32.back().contains("loss_scale")) << "f32 runs without it";
  fs::remove_all(root);
}
