// End-to-end DeepSeek-V4 training (configs/deepseek_v4_debug.toml's model): the loss falls, the
// CSA indexers learn from their logged KL loss (and only while indexer_loss_coeff > 0), the
// hash tables stay as they were while the learned layers' correction biases balance their
// experts (every layer's load logged), full recompute gives the same losses as none, and a run
// stopped at step 3 and resumed reproduces the straight run bit for bit.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// The debug flavor on 48-token sequences: 12 CSA entries of which each query keeps its top 4,
// 3 HCA entries, the 64-token window covering every raw key.
train::JobConfig config(const fs::path& data, const fs::path& run, const std::string& recompute, double indexer_coeff) {
  const std::string toml = R"(
[job]
dump_folder = ")" + run.string() + R"("
[model]
name = "deepseek_v4"
flavor = "debugmodel"
[training]
local_batch_size = 2
seq_len = 48
steps = 6
dataset_path = ")" + data.string() + R"("
mixed_precision_param = "float32"
[optimizer]
lr = 2e-3
[lr_scheduler]
warmup_steps = 1
[checkpoint]
enable = true
interval = 100
keep_latest_k = 0
last_save_model_only = false
[activation_checkpoint]
mode = ")" + recompute + R"("
[metrics]
log_freq = 1
[dsa]
indexer_loss_coeff = )" + std::to_string(indexer_coeff) + R"(
topk = 4
)";
  return train::parse_config(toml, "deepseek_v4_train_test.toml");
}

std::vector<double> logged(const fs::path& run, const std::string& key) {
  std::vector<double> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train" && j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

}  // namespace

TEST(DeepSeekV4TrainE2E, LearnsTrainsItsIndexersAndResumesBitIdentically) {
  const fs::path root = fs::temp_directory_path() / ("titan_v4_e2e_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = test::prepare_words_dataset(root / "data");

  train::Trainer straight(config(data, root / "straight", "none", 0.01), "straight");
  std::map<std::string, Tensor> initial;
  for (auto& [name, t] : straight.model().state_dict()) initial[name] = t.clone();
  const train::TrainResult a = straight.train();
  EXPECT_EQ(a.last_step, 6);
  const std::vector<double> la = logged(root / "straight", "loss");
  ASSERT_EQ(la.size(), 6u);
  EXPECT_LT(la.back(), la.front() - 0.3) << "the loss should fall";
  const std::vector<double> kl = logged(root / "straight", "indexer_loss");
  ASSERT_EQ(kl.size(), 6u);
  for (double v : kl) EXPECT_TRUE(std::isfinite(v) && v > 0);
  int indexer = 0;
  for (auto& [name, t] : straight.model().state_dict()) {
    bool same = true;
    for (size_t i = 0; i < t.nbytes(); ++i)
      same = same && static_cast<const char*>(t.data_ptr())[i] == static_cast<const char*>(initial[name].data_ptr())[i];
    // The expert-load counts restart after every step: zeros again, as at the start.
    const bool stays = name.ends_with("tid2eid") || name.ends_with("tokens_per_expert");
    EXPECT_EQ(same, stays) << name << (stays ? " moved" : " did not train");
    indexer += name.find(".indexer.") != std::string::npos;
  }
  EXPECT_GT(indexer, 0);
  // The expert loads, as DeepSeek-V3's: the worst layer's imbalance, and each layer's (hash layers
  // 0-1 and the learned ones).
  for (const std::string key : {"moe_imbalance_max", "moe_imbalance/layer0", "moe_imbalance/layer5"}) {
    const std::vector<double> imbalance = logged(root / "straight", key);
    ASSERT_EQ(imbalance.size(), 6u) << key;
    for (double v : imbalance) EXPECT_GE(v, 1.0) << key;
  }

  // Without the KL loss the indexers stay where they started (transformers' behaviour); with
  // full recompute the losses are the straight run's.
  {
    train::Trainer frozen(config(data, root / "frozen", "full", 0.0), "frozen");
    std::map<std::string, Tensor> start;
    for (auto& [name, t] : frozen.model().state_dict())
      if (name.find(".indexer.") != std::string::npos) start[name] = t.clone();
    frozen.train();
    for (auto& [name, t] : frozen.model().state_dict())
      if (start.count(name)) {
        EXPECT_EQ(std::memcmp(t.data_ptr(), start[name].data_ptr(), t.nbytes()), 0) << name;
      }
    train::Trainer recomputed(config(data, root / "recomputed", "full", 0.01), "recomputed");
    recomputed.train();
    const std::vector<double> lr = logged(root / "recomputed", "loss");
    ASSERT_EQ(lr.size(), la.size());
    for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(lr[i], la[i]) << "step " << i + 1;
  }

  {
    train::Trainer first(config(data, root / "resumed", "none", 0.01), "first half");
    first.on_step_end = [](int64_t step) {
      if (step == 3) std::raise(SIGINT);
    };
    EXPECT_TRUE(first.train().interrupted);
  }
  train::Trainer second(config(data, root / "resumed", "none", 0.01), "second half");
  EXPECT_EQ(second.train().last_step, 6);
  const std::vector<double> lb = logged(root / "resumed", "loss");
  ASSERT_EQ(lb.size(), la.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(lb[i], la[i]) << "step " << i + 1;
  fs::remove_all(root);
}
