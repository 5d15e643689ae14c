// The figures of one metrics line, over the steps since the line before (its window): tokens/s,
// TFLOP/s and MFU, the data-loading share, peak memory by category and the share of time blocked
// on communication (the largest of any rank), the bytes every rank sent, and how unevenly the
// ranks worked (a straggler is named when one works 1.25x the median rank's time).
#pragma once

#include <cstdint>
#include <string>

#include "titan/distributed/comm_engine.h"
#include "titan/distributed/process_group.h"
#include "titan/train/metrics.h"

namespace titan::train {

class MetricsWindow {
 public:
  struct Shape {
    double tokens_per_step = 0;  // this rank's (its pipeline's) tokens per optimizer step
    double pipeline_share = 1;   // of each token's work this rank does (1 / pipeline degree)
    int64_t dp = 1;              // data-parallel ranks: global tokens = dp x this rank's
    double peak_flops = 0;       // what MFU divides by
  };
  MetricsWindow(const distributed::ProcessGroup& world, distributed::CommEngine& engine, Shape shape);

  // One step done: the seconds it waited for data and its FLOPs per token (which can change from
  // step to step: DeepSeek-V3.2's stages).
  void add_step(double data_seconds, double flops_per_token);
  // Seconds training was blocked in a checkpoint save since the last line.
  void add_save_seconds(double seconds) { save_seconds_ += seconds; }
  // Fills m's throughput, memory and communication figures from the window and starts a new one.
  // Returns a straggler's description ("" when none). Collective over the world.
  std::string close(StepMetrics& m);

 private:
  const distributed::ProcessGroup& world_;
  distributed::CommEngine& engine_;
  Shape shape_;
  double start_ = 0, exposed_at_start_ = 0, data_seconds_ = 0, flops_ = 0, save_seconds_ = 0;
  distributed::CommStats sent_at_start_;
  int64_t steps_ = 0;
  void restart();
};

}  // namespace titan::train
