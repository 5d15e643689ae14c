#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "titan/train/metrics.h"

using namespace titan;
using namespace titan::train;
namespace fs = std::filesystem;

TEST(Metrics, JsonlHoldsEveryLoggedField) {
  const fs::path dir = fs::temp_directory_path() / ("titan_metrics_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    MetricsLogger log(dir, nullptr);
    StepMetrics m;
    m.step = 3;
    m.total_steps = 10;
    m.loss = 2.5;
    m.mfu = 0.41;
    m.memory.peak[int(MemCategory::activations)] = 1 << 20;
    m.summary = {{"indexer_loss", 0.125}};
    m.detail = {{"moe_imbalance/layer1", 1.5}};
    log.log_step(m);
    log.log_validation(3, 2.75, 15.6);
  }
  std::ifstream f(dir / "metrics.jsonl");
  std::string line;
  std::getline(f, line);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["loss"], 2.5);
  EXPECT_EQ(j["indexer_loss"], 0.125);
  EXPECT_EQ(j["moe_imbalance/layer1"], 1.5);
  EXPECT_EQ(j["peak_memory_bytes"]["activations"], 1 << 20);
  std::getline(f, line);
  EXPECT_EQ(nlohmann::json::parse(line)["kind"], "validation");
  fs::remove_all(dir);
}

TEST(Metrics, ConsoleLineFormats) {
  StepMetrics m;
  m.step = 5;
  m.total_steps = 100;
  m.loss = 3.25;
  m.eta_seconds = 125;
  const std::string s = format_step_line(m);
  EXPECT_NE(s.find("step     5/100"), std::string::npos) << s;
  EXPECT_NE(s.find("loss  3.2500"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 2m05s"), std::string::npos) << s;
  EXPECT_EQ(s.find("\033["), std::string::npos) << "no colour unless asked for";
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_duration(3700), "1h01m");
}

// The console carries TorchTitan's fields plus the summaries; per-layer detail stays in the file.
TEST(Metrics, ConsoleShowsSummariesNotDetail) {
  StepMetrics m;
  m.summary = {{"indexer_loss", 0.5}, {"moe_imbalance_max", 1.25}};
  m.detail = {{"moe_imbalance/layer3", 1.25}, {"moe_load_min/layer3", 2}};
  const std::string s = format_step_line(m);
  EXPECT_NE(s.find("indexer_loss 0.5"), std::string::npos) << s;
  EXPECT_NE(s.find("moe_imbalance_max 1.25"), std::string::npos) << s;
  EXPECT_EQ(s.find("layer3"), std::string::npos) << s;
  EXPECT_EQ(s.find("data"), std::string::npos) << s;
}

// metrics.disable_color_printing: colours on a terminal unless disabled; never in a file.
TEST(Metrics, ColourFollowsTheKey) {
  StepMetrics m;
  m.step = 1;
  const std::string coloured = format_step_line(m, true);
  EXPECT_NE(coloured.find("\033[31mstep"), std::string::npos) << coloured;
  EXPECT_NE(coloured.find("\033[39m"), std::string::npos) << coloured;
  JobConfig c;
  c.metrics.disable_color_printing = true;
  EXPECT_FALSE(metrics_options(c, "run").color);
  c.metrics.disable_color_printing = false;
  EXPECT_EQ(metrics_options(c, "run").color, bool(isatty(fileno(stdout))));
}

// metrics.enable_jsonl, metrics.jsonl_file and metrics.save_for_all_ranks pick the file each rank writes.
TEST(Metrics, JsonlKeysPickTheFile) {
  JobConfig c;
  c.metrics.jsonl_file = "logs/train.jsonl";
  EXPECT_EQ(metrics_options(c, "run").jsonl, fs::path("run/logs/train.jsonl"));
  EXPECT_EQ(metrics_options(c, "run").console, stdout);
  EXPECT_TRUE(metrics_options(c, "run", 1).jsonl.empty()) << "only rank 0 writes by default";
  EXPECT_EQ(metrics_options(c, "run", 1).console, nullptr) << "only rank 0 prints";
  c.metrics.save_for_all_ranks = true;
  EXPECT_EQ(metrics_options(c, "run", 3).jsonl, fs::path("run/logs/train_rank3.jsonl"));
  c.metrics.enable_jsonl = false;
  EXPECT_TRUE(metrics_options(c, "run").jsonl.empty());
  EXPECT_TRUE(metrics_options(c, "run", 3).jsonl.empty());

  // A logger without a file still prints, and writes nothing.
  const fs::path dir = fs::temp_directory_path() / ("titan_metrics_off_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  {
    MetricsLogger log(metrics_options(c, dir));
    log.log_event("hello");
  }
  EXPECT_FALSE(fs::exists(dir / "logs" / "train.jsonl"));
  c.metrics.enable_jsonl = true;
  {
    MetricsLogger log(metrics_options(c, dir));
    log.log_event("hello");
  }
  std::ifstream f(dir / "logs" / "train.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(f, line));
  EXPECT_EQ(nlohmann::json::parse(line)["text"], "hello");
  fs::remove_all(dir);
}
