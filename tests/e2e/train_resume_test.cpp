// End-to-end training on a small prepared corpus: the loss falls, and a run interrupted at step
// 10 (Ctrl-C: checkpoint and exit) then resumed reproduces the uninterrupted run bit for bit.
#include <gtest/gtest.h>

#include "common/byte_dataset.h"

#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/data/prepare.h"
#include "titan/optim/swapped_moments.h"
#include "titan/train/checkpointing.h"
#include "titan/optim/adamw.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

fs::path make_dataset(const fs::path& dir) { return test::prepare_templated_dataset(dir); }

train::JobConfig config(const fs::path& data, const fs::path& run, const std::vector<std::string>& extra = {}) {
  const std::string toml = R"(
[job]
dump_folder = ")" + run.string() + R"("
[model]
name = "llama3"
flavor = "debugmodel"
[training]
local_batch_size = 4
seq_len = 64
steps = 20
dataset_path = ")" + data.string() + R"("
mixed_precision_param = "float32"
[optimizer]
lr = 3e-3
[lr_scheduler]
warmup_steps = 4
decay_ratio = 0.5
decay_type = "cosine"
[checkpoint]
enable = true
interval = 100
keep_latest_k = 0
last_save_model_only = false
[activation_checkpoint]
mode = "none"
[metrics]
log_freq = 1
[validation]
enable = true
local_batch_size = 2
seq_len = 64
freq = 10
steps = 4
)";
  return train::parse_config(toml, "train_resume_test.toml", extra);
}

std::vector<double> losses(const fs::path& run) {
  std::vector<double> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "train") out.push_back(j["loss"].get<double>());
  }
  return out;
}

// A step folder's tensors as metadata.json lists them: dtype, shape and every piece's checksum.
nlohmann::json saved_tensors(const fs::path& step_folder) {
  std::ifstream f(step_folder / "metadata.json");
  return nlohmann::json::parse(f)["tensors"];
}

}  // namespace

TEST(TrainE2E, LearnsAndResumesBitIdentically) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");

  train::Trainer straight(config(data, root / "straight"), "straight");
  const train::TrainResult a = straight.train();
  const std::vector<double> la = losses(root / "straight");
  ASSERT_EQ(la.size(), 20u);
  EXPECT_LT(la.back(), 0.6 * la.front()) << "the loss should fall well below its start";
  EXPECT_GT(a.last_val_loss, 0);
  EXPECT_LT(a.last_val_loss, std::log(257.0));

  {
    train::Trainer first(config(data, root / "resumed"), "first half");
    first.on_step_end = [](int64_t step) {
      if (step == 10) std::raise(SIGINT);  // the user presses Ctrl-C during step 10
    };
    const train::TrainResult r = first.train();
    EXPECT_TRUE(r.interrupted);
    EXPECT_EQ(r.last_step, 10);
    EXPECT_TRUE(fs::exists(root / "resumed/checkpoint/step-10/metadata.json"));
  }
  train::Trainer second(config(data, root / "resumed"), "second half");
  const train::TrainResult b = second.train();
  EXPECT_EQ(b.last_step, 20);
  const std::vector<double> lb = losses(root / "resumed");
  ASSERT_EQ(lb.size(), 20u);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(la[i], lb[i]) << "step " << i + 1;
  EXPECT_EQ(a.last_val_loss, b.last_val_loss);

  // Async saves through a 1 MiB staging buffer (the debug model's state is several MiB, so the
  // writer streams it while the next steps run, and their optimizer steps wait for it): training
  // is unchanged, and step 10's checkpoint is bit for bit the synchronous one the run above
  // resumed from.
  train::Trainer async(config(data, root / "async", {"--checkpoint.async_mode=async", "--checkpoint.interval=5",
                                                     "--checkpoint.staging_mib=1"}),
                       "async");
  async.train();
  EXPECT_EQ(losses(root / "async"), la);
  EXPECT_EQ(saved_tensors(root / "async/checkpoint/step-10"), saved_tensors(root / "resumed/checkpoint/step-10"));
  fs::remove_all(root);
}

// The swap optimizer (moments in a file, streamed in 1 MiB chunks: the debug model's state spans
// several) trains bit for bit as AdamW in memory, straight and interrupted + resumed, and its
// checkpoints (async ones included) are the in-memory optimizer's: a run saved with swap resumes
// without it.
TEST(TrainE2E, SwapOptimizerTrainsAndResumesBitIdentically) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_swap_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  // Async saves every 5 steps too: the writer streams the swapped moments from the swap file
  // through a 1 MiB staging buffer, never holding them whole.
  const std::vector<std::string> swap = {"--optimizer.swap=file", "--optimizer.swap_chunk_mb=1",
                                         "--optimizer.swap_path=" + (root / "swap").string(),
                                         "--checkpoint.async_mode=async", "--checkpoint.interval=5",
                                         "--checkpoint.staging_mib=1"};
  train::Trainer memory(config(data, root / "memory"), "in memory");
  const train::TrainResult a = memory.train();
  const std::vector<double> la = losses(root / "memory");
  ASSERT_EQ(la.size(), 20u);

  train::Trainer swapped(config(data, root / "swapped", swap), "swapped");
  const auto& adamw = dynamic_cast<const optim::AdamW&>(swapped.optimizer());
  ASSERT_NE(adamw.swapped(), nullptr);
  EXPECT_GT(adamw.swapped()->chunk_count(), 2);
  const train::TrainResult b = swapped.train();
  EXPECT_EQ(losses(root / "swapped"), la);
  EXPECT_EQ(a.last_val_loss, b.last_val_loss);
  EXPECT_TRUE(fs::is_empty(root / "swap")) << "swap files are unlinked once open";

  for (const bool resume_swapped : {true, false}) {
    const fs::path run = root / (resume_swapped ? "resumed_swapped" : "resumed_in_memory");
    {
      train::Trainer first(config(data, run, swap), "first half");
      first.on_step_end = [](int64_t step) {
        if (step == 10) std::raise(SIGINT);
      };
      EXPECT_TRUE(first.train().interrupted);
    }
    train::Trainer second(config(data, run, resume_swapped ? swap : std::vector<std::string>{}), "second half");
    EXPECT_EQ(second.train().last_step, 20);
    EXPECT_EQ(losses(run), la) << (resume_swapped ? "resumed with swap" : "saved with swap, resumed in memory");
  }
  // The async save of step 10 (streamed while steps 11.. ran) is bit for bit the synchronous one.
  EXPECT_EQ(saved_tensors(root / "swapped/checkpoint/step-10"), saved_tensors(root / "resumed_swapped/checkpoint/step-10"));
  fs::remove_all(root);
}

// A swap folder that cannot be created fails at the start, naming the file and the key to change.
TEST(TrainE2E, UnwritableSwapPathIsAClearError) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_swap_error_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  std::ofstream(root / "a_file") << "not a folder";
  // Even root cannot make a folder inside a file.
  const std::string swap_path = (root / "a_file" / "swap").string();
  try {
    train::Trainer t(config(data, root / "run", {"--optimizer.swap=file", "--optimizer.swap_path=" + swap_path}), "x");
    t.train();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find(swap_path), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("[optimizer] swap_path"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}

// A dataset folder or tokenizer file that is not there fails before the run writes anything,
// naming the config, the key and the script that makes the default corpus and its tokenizer.
TEST(TrainE2E, MissingDataOrTokenizerFailsFirst) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_missing_" + std::to_string(::getpid()));
  fs::remove_all(root);
  try {
    train::Trainer t(config(root / "no_data", root / "run"), "missing.toml");
    FAIL() << "a missing dataset folder was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find("missing.toml: training.dataset_path = \"" + (root / "no_data").string() +
                                            "\" is not a folder"),
              std::string::npos)
        << e.message();
    EXPECT_NE(std::string(e.hint()).find("scripts/prepare_data.sh"), std::string::npos) << e.hint();
  }
  EXPECT_FALSE(fs::exists(root / "run"));
  // Likewise a tokenizer file that is not there (the dataset folder exists this time).
  fs::create_directories(root / "data");
  train::JobConfig c = config(root / "data", root / "run");
  c.model.tokenizer_path = (root / "no_tokenizer.json").string();
  try {
    train::Trainer t(c, "missing.toml");
    FAIL() << "a missing tokenizer file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.message()).find("missing.toml: model.tokenizer_path = \"" + c.model.tokenizer_path +
                                            "\" is not a file"),
              std::string::npos)
        << e.message();
    EXPECT_NE(std::string(e.hint()).find("scripts/prepare_data.sh"), std::string::npos) << e.hint();
  }
  EXPECT_FALSE(fs::exists(root / "run"));
  fs::remove_all(root);
}

// Pipeline parallelism: the schedule's own checks come first (here 1F1B over 2 ranks given one
// micro-batch), naming the config; the rest (stages, composition) in pipeline_parallel_test.
TEST(TrainE2E, PipelineParallelChecksTheScheduleFirst) {
  train::JobConfig c = config("/nonexistent", "/nonexistent/run");
  c.parallelism.pipeline_parallel_degree = 2;
  c.parallelism.pipeline_parallel_microbatch_size = c.training.local_batch_size;  // one micro-batch
  try {
    train::Trainer t(c, "pp.toml");
    FAIL() << "1F1B over 2 ranks with 1 micro-batch was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("pp.toml: 1F1B needs at least as many micro-batches as pipeline ranks (2), got 1"),
              std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("pipeline_parallel_microbatch_size"), std::string::npos) << e.hint();
  }
}

// job.print_config prints the resolved TOML at the start; metrics.enable_tensorboard is refused.
TEST(TrainE2E, PrintConfigKey) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_keys_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  train::JobConfig c = config(data, root / "run");
  c.training.steps = 1;
  c.lr_scheduler.warmup_steps = 1;
  c.validation.enable = false;
  c.checkpoint.enable = false;
  for (bool print : {false, true}) {
    c.job.print_config = print;
    ::testing::internal::CaptureStdout();
    {
      train::Trainer t(c, "keys.toml");
      t.train();
    }
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(out.find("the resolved configuration") != std::string::npos, print) << out;
    EXPECT_EQ(out.find("\n[training]\n") != std::string::npos, print) << out;
    EXPECT_EQ(out.find("\nlocal_batch_size = 4\n") != std::string::npos, print) << out;
  }
  // A key the model cannot act on is refused, not ignored: llama3 has no Hugging Face conversion.
  c.checkpoint.last_save_in_hf = true;
  try {
    train::Trainer t(c, "keys.toml");
    FAIL() << "checkpoint.last_save_in_hf = true was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("keys.toml: checkpoint.last_save_in_hf = true, but model llama3 has no Hugging Face "
                               "conversion"),
              std::string::npos) << e.message();
  }
  fs::remove_all(root);
}

// The final save of checkpoint.last_save_model_only holds the weights alone: a rerun with more
// steps resumes from the newest full checkpoint before it (never from step 0 with a fresh
// optimizer), leaving the earlier checkpoints as they were; with no full checkpoint at all, or
// load_step naming an export, the run refuses and says how to start from the weights.
TEST(TrainE2E, AWeightsOnlyFinalSaveIsNeverAResumePoint) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_weights_only_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  const std::vector<std::string> saving = {"--checkpoint.interval=2", "--checkpoint.last_save_model_only=true",
                                           "--validation.enable=false"};
  const auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), saving.begin(), saving.end());
    return extra;
  };
  const fs::path run = root / "run", ckpt = run / "checkpoint";
  train::Trainer(config(data, run, with({"--training.steps=6"})), "first").train();
  ASSERT_TRUE(train::is_weights_only(ckpt / "step-6"));
  ASSERT_FALSE(train::is_weights_only(ckpt / "step-4"));
  const auto bytes = [](const fs::path& file) {
    std::ifstream f(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string step2 = bytes(ckpt / "step-2" / "shard-00000.safetensors");
  const train::TrainResult again = train::Trainer(config(data, run, with({"--training.steps=8"})), "again").train();
  EXPECT_EQ(again.last_step, 8);
  std::vector<int64_t> steps;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);)
    if (const auto j = nlohmann::json::parse(line); j["kind"] == "train") steps.push_back(j["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 5, 6, 7, 8})) << "the rerun goes on from step 4";
  EXPECT_EQ(bytes(ckpt / "step-2" / "shard-00000.safetensors"), step2) << "an earlier checkpoint was overwritten";
  EXPECT_FALSE(train::is_weights_only(ckpt / "step-6"));  // saved again by the rerun, whole
  // load_at_most (what `titan launch` sets on a restart of a run that pinned load_step) bounds the
  // step resumed from, over load_step: here the newest full checkpoint up to 5 is step 4.
  train::Trainer(config(data, run, with({"--training.steps=8", "--checkpoint.load_step=2",
                                         "--checkpoint.load_at_most=5"})), "bounded").train();
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(run / "progress.json"))["resumed_from"], 4);
  // A train_state.json whose step is not the one its metadata commits is damage, not a place to
  // go on from.
  nlohmann::json state = nlohmann::json::parse(std::ifstream(ckpt / "step-6" / "train_state.json"));
  state["step"] = -5;
  std::ofstream(ckpt / "step-6" / "train_state.json") << state.dump();
  try {
    train::Trainer(config(data, run, with({"--training.steps=8", "--checkpoint.load_step=6"})), "bad step");
    ADD_FAILURE() << "a train_state.json of step -5 was loaded";
  } catch (const checkpoint::CorruptCheckpoint& e) {
    EXPECT_NE(e.message().find("step -5, but metadata.json commits step 6"), std::string::npos) << e.what();
  }

  const fs::path only = root / "only";
  train::Trainer(config(data, only, with({"--training.steps=1"})), "export").train();
  const std::string refused = [&] {
    try {
      train::Trainer(config(data, only, with({"--training.steps=3"})), "rerun").train();
    } catch (const Error& e) {
      return e.message() + " " + e.hint();
    }
    return std::string("(no error)");
  }();
  EXPECT_NE(refused.find("holds the weights alone"), std::string::npos) << refused;
  EXPECT_NE(refused.find("checkpoint.initial_load_path = \"" + (only / "checkpoint" / "step-1").string()), std::string::npos)
      << refused;
  EXPECT_THROW(train::Trainer(config(data, run, with({"--training.steps=8", "--checkpoint.load_step=8"})), "pinned"),
               Error);
  fs::remove_all(root);
}

// MFU divides by the best peak this machine measured, kept from run to run: a real run never
// reports more than 100%, even when its own measurement at start comes out low. The cache here
// holds a figure far below the truth, as a contended measurement would: it is replaced.
TEST(TrainE2E, MfuStaysAtMost100Percent) {
  const fs::path root = fs::temp_directory_path() / ("titan_e2e_mfu_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = make_dataset(root / "data");
  ::setenv("TITAN_CACHE_DIR", (root / "cache").c_str(), 1);
  train::Trainer(config(data, root / "run", {"--training.steps=4", "--checkpoint.enable=false", "--validation.enable=false"}),
                 "mfu")
      .train();
  const nlohmann::json cached = nlohmann::json::parse(std::ifstream(root / "cache" / "machine_peak.json"));
  ASSERT_EQ(cached.size(), 1u);
  nlohmann::json low = cached;
  for (auto& [key, entry] : low.items()) entry["f32_flops"] = 1e6;  // 1 MFLOP/s
  std::ofstream(root / "cache" / "machine_peak.json") << low.dump();
  train::Trainer(config(data, root / "run2", {"--training.steps=4", "--checkpoint.enable=false",
                                              "--validation.enable=false"}), "mfu again")
      .train();
  std::ifstream f(root / "run2" / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(f, line);)
    if (const auto j = nlohmann::json::parse(line); j["kind"] == "train") {
      ++steps;
      EXPECT_GT(j["mfu"].get<double>(), 0) << line;
      EXPECT_LE(j["mfu"].get<double>(), 1.0) << line;
    }
  EXPECT_EQ(steps, 4);
  const nlohmann::json after = nlohmann::json::parse(std::ifstream(root / "cache" / "machine_peak.json"));
  ASSERT_EQ(after.size(), 1u);
  EXPECT_GT(after.begin()->at("f32_flops").get<double>(), 1e9) << "the low figure was kept";
  ::unsetenv("TITAN_CACHE_DIR");
  fs::remove_all(root);
}
