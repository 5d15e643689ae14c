// Per-step training metrics: one console line every log_freq steps and one JSON object per
// logged step in <run folder>/metrics.jsonl (machine-readable; plots and tests read it).
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "titan/core/allocator.h"

namespace titan::train {

struct StepMetrics {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double step_seconds = 0;      // wall time of this step
  double tokens_per_second = 0;
  double tflops = 0;            // model FLOPs per second achieved (training: 6N + attention)
  double mfu = 0;               // tflops / measured peak for the compute precision
  double data_share = 0;        // fraction of the step spent waiting for data
  double eta_seconds = 0;
  MemoryStats memory;           // peak bytes by category during the step
  std::map<std::string, double> extra;  // e.g. "indexer_loss", "moe_imbalance/layer3"
};

class MetricsLogger {
 public:
  // Appends to <run_folder>/metrics.jsonl (created if needed). console may be null (quiet).
  MetricsLogger(const std::filesystem::path& run_folder, std::FILE* console = stdout);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  void log_step(const StepMetrics& m);
  void log_validation(int64_t step, double loss, double perplexity);
  void log_event(const std::string& text);  // free-form line (checkpoint saved, resumed, ...)

 private:
  std::FILE* jsonl_ = nullptr;
  std::FILE* console_;
};

// "1.23 GiB" style.
std::string format_bytes(double bytes);
// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);
// One console line for a step: step, loss, grad norm, lr, tokens/s, TFLOP/s, MFU, memory, data share, ETA.
std::string format_step_line(const StepMetrics& m);

}  // namespace titan::train
