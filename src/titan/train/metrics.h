// Per-step training metrics: one console line every log_freq steps (what TorchTitan prints, plus
// one summary per extra loss or statistic) and one JSON object per logged step in the run
// folder's metrics.jsonl with everything (machine-readable; plots and tests read it).
#pragma once

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/train/config.h"

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
  // Console and metrics.jsonl: extra losses and summaries, e.g. "indexer_loss", "moe_imbalance_max".
  std::vector<std::pair<std::string, double>> summary;
  // metrics.jsonl only, e.g. "moe_imbalance/layer3".
  std::vector<std::pair<std::string, double>> detail;
};

class TensorBoardWriter;

struct MetricsOptions {
  std::filesystem::path jsonl;    // the JSON-lines file to append to; empty: none
  std::filesystem::path tensorboard;  // the folder of TensorBoard event files to write; empty: none
  std::FILE* console = stdout;    // null: quiet
  bool color = false;             // ANSI colours on the console line
};

class MetricsLogger {
 public:
  MetricsLogger(const std::filesystem::path& run_folder, std::FILE* console = stdout);  // run_folder/metrics.jsonl
  explicit MetricsLogger(const MetricsOptions& options);
  ~MetricsLogger();
  MetricsLogger(const MetricsLogger&) = delete;
  MetricsLogger& operator=(const MetricsLogger&) = delete;

  void log_step(const StepMetrics& m);
  void log_validation(int64_t step, double loss, double perplexity);
  void log_event(const std::string& text);  // free-form line (checkpoint saved, resumed, ...)

 private:
  void write_json(const std::string& line);
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  std::FILE* console_;
  bool color_;
};

// The [metrics] keys for rank `rank` of a run writing to `run_folder`: rank 0 prints the console
// (coloured on a terminal unless disable_color_printing) and writes jsonl_file (when enable_jsonl);
// other ranks print nothing and, with save_for_all_ranks, write <jsonl_file stem>_rank<r><ext>.
// With enable_tensorboard, rank 0 writes event files in save_tb_folder (and, with save_for_all_ranks,
// rank r in save_tb_folder/rank_<r>).
MetricsOptions metrics_options(const JobConfig& config, const std::filesystem::path& run_folder, int rank = 0);

// The TensorBoard scalars of a step: TorchTitan's tags where the value is the same
// (loss_metrics/global_avg_loss, grad_norm, lr, mfu(%), memory/...), throughput_all_ranks(tps)
// and tflops_all_ranks (over every data-parallel rank, where TorchTitan's are per device), and
// every summary and detail entry.
std::vector<std::pair<std::string, double>> tensorboard_scalars(const StepMetrics& m);

// "1.23 GiB" style.
std::string format_bytes(double bytes);
// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);
// One console line for a step: step, loss, grad norm, lr, tokens/s, TFLOP/s, MFU, peak memory,
// ETA, then each summary entry; with `color`, ANSI colours as TorchTitan's console uses them.
std::string format_step_line(const StepMetrics& m, bool color = false);

}  // namespace titan::train
