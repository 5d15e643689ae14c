#include <gtest/gtest.h>

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
    m.extra["indexer_loss"] = 0.125;
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
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_duration(3700), "1h01m");
}
