// End-to-end DeepSeek-V3.2 training through both DSA stages, with each implementation: a dense
// warm-up that trains only the indexers (the parameters at its end against the initial ones),
// the switch to sparse training, a finite loss and the indexer loss logged.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "titan/data/prepare.h"
#include "titan/models/causal_lm.h"
#include "titan/optim/adamw.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

train::JobConfig config(const fs::path& data, const fs::path& run, const std::string& converters) {
  // The debug flavor, with a top-k of 8 so that 32-token sequences have a real selection.
  const std::string toml = R"(
[job]
dump_folder = ")" + run.string() + R"("
[model]
name = "deepseek_v32"
flavor = "debugmodel"
converters = [)" + converters + R"(]
[training]
local_batch_size = 1
seq_len = 32
steps = 4
dataset_path = ")" + data.string() + R"("
mixed_precision_param = "float32"
[optimizer]
lr = 1e-3
[lr_scheduler]
warmup_steps = 1
[checkpoint]
enable = false
[activation_checkpoint]
mode = "none"
[metrics]
log_freq = 1
[dsa]
warmup_steps = 2
indexer_loss_coeff = 0.01
topk = 8
)";
  return train::parse_config(toml, "deepseek_v32_train_test.toml");
}

}  // namespace

TEST(DeepSeekV32TrainE2E, WarmupThenSparseWithBothImplementations) {
  const fs::path root = fs::temp_directory_path() / ("titan_v32_e2e_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = test::prepare_words_dataset(root / "data");
  for (const std::string converters : {"", "\"dsa_fused\""}) {
    const fs::path run = root / (converters.empty() ? "small_ops" : "fused");
    train::Trainer trainer(config(data, run, converters), run.string());
    // At the end of the warm-up only the indexers have moved from their initial values; after
    // the sparse steps everything has (but MoE's balancing bias, which moves only when loads differ).
    std::map<std::string, Tensor> initial;
    for (auto& [name, t] : trainer.model().state_dict()) initial[name] = t.clone();
    int indexer_params = 0;
    trainer.on_step_end = [&](int64_t step) {
      if (step != 2 && step != 4) return;
      for (auto& [name, t] : trainer.model().state_dict()) {
        if (name.find("tokens_per_expert") != std::string::npos) continue;  // a counter, not a weight
        const bool indexer = name.find(".attention.indexer.") != std::string::npos;
        indexer_params += step == 2 && indexer;
        bool same = true;
        for (int64_t i = 0; i < t.numel(); ++i) same = same && t.data<float>()[i] == initial[name].data<float>()[i];
        if (step == 2) {
          EXPECT_EQ(same, !indexer) << run << ": " << name << (indexer ? " did not train" : " moved while frozen");
        } else if (name.find("expert_bias") == std::string::npos) {
          EXPECT_FALSE(same) << run << ": " << name << " did not train in the sparse stage";
        }
      }
    };
    const train::TrainResult r = trainer.train();
    EXPECT_GT(indexer_params, 0);
    // Bias corrections count each parameter's own updates: the indexers had all 4, the rest
    // only the 2 sparse steps (their first sparse update is their update 1, not 3).
    int full_steps = 0;
    const auto& adamw = dynamic_cast<const optim::AdamW&>(trainer.optimizer());
    for (auto& [name, p] : trainer.model().named_parameters()) {
      const int64_t n = adamw.param_steps(name);
      if (name.find(".attention.indexer.") != std::string::npos) {
        EXPECT_EQ(n, 4) << run << ": " << name;
      } else {
        EXPECT_LE(n, 2) << run << ": " << name;
        full_steps += n == 2;
      }
    }
    EXPECT_GT(full_steps, 0);
    EXPECT_EQ(r.last_step, 4);
    EXPECT_TRUE(std::isfinite(r.last_loss));

    std::vector<std::string> events;
    int with_indexer_loss = 0;
    std::ifstream f(run / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] == "event" && !j["text"].get<std::string>().starts_with("plots: ")) events.push_back(j["text"]);
      if (j["kind"] == "train" && j.contains("indexer_loss")) {
        EXPECT_TRUE(std::isfinite(j["indexer_loss"].get<double>()));
        EXPECT_GT(j["indexer_loss"].get<double>(), 0);
        ++with_indexer_loss;
      }
    }
    EXPECT_EQ(with_indexer_loss, 4) << run;
    ASSERT_EQ(events.size(), 2u) << run;
    EXPECT_NE(events[0].find("dense_warmup from step 1"), std::string::npos) << events[0];
    EXPECT_NE(events[1].find("sparse from step 3"), std::string::npos) << events[1];

  }
  fs::remove_all(root);
}
