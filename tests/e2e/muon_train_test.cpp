// [optimizer] name = "Muon" end to end on the llama3 debug model: the run says which parameters
// go to Muon and which to AdamW, the loss falls, a run interrupted and resumed reproduces the
// uninterrupted one bit for bit (the momentum buffers go through the checkpoint), the swap
// optimizer trains bit for bit as in memory, and a checkpoint of one optimizer resumes under the
// other only with checkpoint.allow_optimizer_switch. DeepSeek-V4's debug model trains under Muon.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"
#include "common/run_toml.h"

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/optim/muon_adamw.h"
#include "titan/optim/swapped_moments.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

// The shared debug run (common/run_toml.h) of llama3 for 12 steps under Muon, with checkpoints.
train::JobConfig config(const fs::path& data, const fs::path& run, const std::vector<std::string>& extra = {}) {
  const std::string toml = test::base_toml("llama3", data, run, 12) +
                           "[checkpoint]\nenable = true\ninterval = 100\nkeep_latest_k = 0\nlast_save_model_only = false\n";
  std::vector<std::string> overrides = {"--training.local_batch_size=4", "--optimizer.name=Muon",
                                        "--lr_scheduler.warmup_steps=2"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  return train::parse_config(toml, "muon_train_test.toml", overrides);
}

std::vector<double> losses(const fs::path& run) { return test::losses_of(run); }

// Trains `run` to step 12, stopping once (Ctrl-C: checkpoint and exit) after step 6 and resuming.
void train_interrupted(const fs::path& data, const fs::path& run, const std::vector<std::string>& extra = {}) {
  {
    train::Trainer first(config(data, run, extra), "first half");
    first.on_step_end = [](int64_t step) {
      if (step == 6) std::raise(SIGINT);
    };
    const train::TrainResult r = first.train();
    ASSERT_TRUE(r.interrupted);
    ASSERT_EQ(r.last_step, 6);
  }
  train::Trainer second(config(data, run, extra), "second half");
  EXPECT_EQ(second.train().last_step, 12);
}

struct MuonTrain : testing::Test {
  fs::path root = fs::temp_directory_path() / ("titan_muon_e2e_" + std::to_string(::getpid()));
  fs::path data;
  void SetUp() override {
    fs::remove_all(root);
    data = test::prepare_templated_dataset(root / "data");
  }
  void TearDown() override { fs::remove_all(root); }
};

}  // namespace

TEST_F(MuonTrain, LearnsAndResumesBitIdentically) {
  testing::internal::CaptureStdout();
  std::vector<double> straight;
  {
    train::Trainer t(config(data, root / "straight"), "straight");
    EXPECT_EQ(t.optimizer().name(), "Muon");
    t.train();
    straight = losses(root / "straight");
  }
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("optimizer groups:\n  Muon:  42 tensors, 5111808 elements (layers.0.attention.wq.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("  AdamW: 15 tensors, 134912 elements (tok_embeddings.weight"), std::string::npos) << out;
  ASSERT_EQ(straight.size(), 12u);
  EXPECT_LT(straight.back(), 0.7 * straight.front()) << "the loss should fall well below its start";

  train_interrupted(data, root / "resumed");
  const std::vector<double> resumed = losses(root / "resumed");
  ASSERT_EQ(resumed.size(), 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

// Muon's momentum and AdamW's moments in swap files streamed in 1 MiB chunks (each spans several):
// the same losses to the last bit, interrupted and resumed included.
TEST_F(MuonTrain, SwapOptimizerTrainsAndResumesBitIdentically) {
  const std::vector<std::string> swap = {"--optimizer.swap=file", "--optimizer.swap_chunk_mb=1",
                                         "--optimizer.swap_path=" + (root / "swap").string()};
  train::Trainer memory(config(data, root / "memory"), "in memory");
  memory.train();
  const std::vector<double> in_memory = losses(root / "memory");
  ASSERT_EQ(in_memory.size(), 12u);
  train_interrupted(data, root / "swapped", swap);
  EXPECT_EQ(losses(root / "swapped"), in_memory);
  train::Trainer probe(config(data, root / "probe", swap), "probe");
  const auto& opt = dynamic_cast<const optim::MuonAdamW&>(probe.optimizer());
  ASSERT_NE(opt.muon().swapped(), nullptr);
  EXPECT_GT(opt.muon().swapped()->chunk_count(), 2);
  ASSERT_NE(opt.adamw().swapped(), nullptr);
  EXPECT_TRUE(fs::is_empty(root / "swap")) << "swap files are unlinked once open";
}

// A Muon checkpoint under optimizer.name = "AdamW": an error naming the key, unless the key allows
// the switch; then AdamW starts fresh from the weights, step and data position.
TEST_F(MuonTrain, SwitchingOptimizerNeedsTheFlag) {
  {
    train::Trainer first(config(data, root / "run", {"--training.steps=3"}), "muon");
    first.train();
  }
  const std::vector<std::string> adamw = {"--optimizer.name=AdamW", "--training.steps=5"};
  try {
    train::Trainer refused(config(data, root / "run", adamw), "adamw");
    ADD_FAILURE() << "resuming Muon's checkpoint with AdamW was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("holds Muon's optimizer state, but optimizer.name = \"AdamW\""), std::string::npos)
        << e.message();
    EXPECT_NE((e.message() + e.hint()).find("checkpoint.allow_optimizer_switch = true"), std::string::npos)
        << e.message() << "\n" << e.hint();
  }
  std::vector<std::string> allowed = adamw;
  allowed.push_back("--checkpoint.allow_optimizer_switch=true");
  testing::internal::CaptureStdout();
  train::Trainer switched(config(data, root / "run", allowed), "adamw");
  const train::TrainResult r = switched.train();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("was trained with Muon: its optimizer state is dropped and AdamW starts fresh"), std::string::npos)
      << out;
  EXPECT_EQ(r.last_step, 5);
  EXPECT_EQ(losses(root / "run").size(), 5u) << "steps 1-3 under Muon, 4-5 under AdamW";
  EXPECT_EQ(switched.optimizer().name(), "AdamW");
  // Its own checkpoint records AdamW now: resuming it with AdamW needs no flag.
  train::Trainer again(config(data, root / "run", {"--optimizer.name=AdamW", "--training.steps=6"}), "adamw again");
  EXPECT_EQ(again.train().last_step, 6);
}

// Tensor parallelism, once refused, passes check_supported (and so `titan plan`): each TP-split
// matrix is gathered at one owner (optim/muon.h; tests/distributed/muon_layouts_test.cpp).
TEST(MuonLayouts, TensorParallelismIsAccepted) {
  const train::JobConfig c = config("/nonexistent", "/tmp/unused", {"--parallelism.tensor_parallel_degree=2"});
  EXPECT_NO_THROW(train::check_supported(c, "muon.toml"));
}

// The DeepSeek-V4 recipe under Muon (configs/deepseek_v4_debug.toml's commented alternative): the
// debug model trains, mHC's fn projections on Muon and the compressor's position bias, the sinks
// and mHC's base and scale on AdamW (the paper's split, optim/param_groups.h).
TEST_F(MuonTrain, DeepSeekV4TrainsWithMuon) {
  testing::internal::CaptureStdout();
  train::Trainer t(config(data, root / "v4", {"--model.name=deepseek_v4", "--dsa.topk=4", "--training.steps=8",
                                              "--checkpoint.enable=false"}),
                   "v4");
  t.train();
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("optimizer groups:"), std::string::npos) << out;
  int fn = 0, adamw_small = 0;
  for (const auto& [key, shape] : t.optimizer().state_shapes()) {
    fn += key.ends_with(".fn.momentum_buffer");
    adamw_small += key.ends_with("position_bias.exp_avg") || key.ends_with("sinks.exp_avg") || key.ends_with("base.exp_avg");
  }
  EXPECT_GT(fn, 0) << "mHC's fn projections should be Muon's";
  EXPECT_GT(adamw_small, 0) << "the position bias, sinks and mHC's base should be AdamW's";
  const std::vector<double> l = losses(root / "v4");
  ASSERT_EQ(l.size(), 8u);
  EXPECT_LT(l.back(), l.front());
}
