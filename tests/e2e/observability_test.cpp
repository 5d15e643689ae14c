// The main job's config (configs/deepseek_v32_debug.toml) leaves a run folder to look at: a
// Chrome trace and a memory snapshot of the profiled steps, TensorBoard events holding the
// logged values, and the plots.
#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/byte_dataset.h"
#include "titan/train/config.h"
#include "titan/train/tensorboard.h"
#include "titan/train/trainer.h"

using namespace titan;
namespace fs = std::filesystem;
using nlohmann::json;

TEST(Observability, MainJobRunFolderHoldsTraceEventsPlotsAndSnapshots) {
  const fs::path root = fs::temp_directory_path() / ("titan_observe_" + std::to_string(::getpid()));
  fs::remove_all(root);
  const fs::path data = test::prepare_templated_dataset(root / "data");
  const fs::path run = root / "run";
  // The main job's keys as they are; only the size of the run and its data change.
  const train::JobConfig cfg = train::load_config(
      "configs/deepseek_v32_debug.toml",
      {"--job.dump_folder=" + run.string(), "--training.dataset_path=" + data.string(), "--training.steps=4", "--model.tokenizer_path=",
       "--training.seq_len=32", "--training.local_batch_size=1", "--dsa.warmup_steps=2", "--dsa.topk=8",
       "--validation.enable=true", "--validation.freq=2", "--validation.steps=1", "--validation.seq_len=32",
       "--validation.local_batch_size=1", "--profiling.profile_freq=2", "--metrics.log_freq=1",
       "--checkpoint.interval=2", "--checkpoint.async_mode=async"});
  ASSERT_TRUE(cfg.metrics.enable_tensorboard && cfg.metrics.enable_plots && cfg.profiling.enable_profiling &&
              cfg.profiling.enable_memory_snapshot);
  {
    train::Trainer trainer(cfg, "configs/deepseek_v32_debug.toml");
    trainer.train();
  }

  // The trace of step 2: ops forward and backward, data loading, the optimizer, the checkpoint's
  // staging (its writer thread has a track of its own, but may finish after the trace is written).
  const json trace = json::parse(std::ifstream(run / "profile_trace/iteration_2/rank0_trace.json"));
  std::set<std::string> names, threads;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X") names.insert(e["name"].get<std::string>());
    if (e.value("name", "") == "thread_name") threads.insert(e["args"]["name"].get<std::string>());
  }
  for (const char* n : {"data loading", "forward", "backward", "optimizer", "linear.fwd", "linear.bwd",
                        "checkpoint staging"})
    EXPECT_TRUE(names.count(n)) << "no '" << n << "' span in the trace";
  EXPECT_TRUE(threads.count("main"));

  // TensorBoard: every logged step's loss and each validation loss, as the metrics file has them.
  std::vector<fs::path> event_files;
  for (const auto& e : fs::directory_iterator(run / "tb")) event_files.push_back(e.path());
  ASSERT_EQ(event_files.size(), 1u);
  std::map<std::pair<std::string, int64_t>, float> events;
  const auto event = [&](const std::string& tag, const json& step) { return events[{tag, step.get<int64_t>()}]; };
  for (const train::TensorBoardScalar& s : train::read_tensorboard_scalars(event_files[0]))
    events[{s.tag, s.step}] = s.value;
  int train_lines = 0, validation_lines = 0;
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const json j = json::parse(line);
    if (j["kind"] == "train") {
      ++train_lines;
      EXPECT_EQ(event("loss_metrics/global_avg_loss", j["step"]), float(j["loss"].get<double>()));
      EXPECT_EQ(event("loss_metrics/indexer_loss", j["step"]), float(j["indexer_loss"].get<double>()));
      EXPECT_TRUE(events.count({"moe_imbalance/layer1", j["step"].get<int64_t>()}));
    } else if (j["kind"] == "validation") {
      ++validation_lines;
      EXPECT_EQ(event("validation_metrics/loss", j["step"]), float(j["loss"].get<double>()));
    }
  }
  EXPECT_EQ(train_lines, 4);
  EXPECT_EQ(validation_lines, 2);

  // The plots the run ended with, and a chart beside each memory snapshot.
  for (const char* png : {"loss.png", "throughput.png", "memory.png", "expert_load.png"})
    EXPECT_GT(fs::file_size(run / "plots" / png), 10000u) << png;
  for (const char* step : {"iteration_2", "iteration_4"}) {
    const fs::path snap = run / "memory_snapshot" / step / "rank0_memory_snapshot";
    EXPECT_GT(json::parse(std::ifstream(snap.string() + ".json"))["peak_bytes"].get<int64_t>(), 0);
    EXPECT_GT(fs::file_size(snap.string() + ".png"), 5000u);
  }
  fs::remove_all(root);
}
