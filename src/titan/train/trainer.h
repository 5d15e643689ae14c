// The training loop: data -> forward -> loss -> backward -> clip -> the optimizer (AdamW, or
// Muon with AdamW: [optimizer] name) with the LR schedule, with gradient accumulation, validation, metrics, checkpoints and exact resume.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>

#include "titan/distributed/process_group.h"
#include "titan/models/causal_lm.h"
#include "titan/optim/optimizer.h"
#include "titan/train/config.h"

namespace titan::distributed::pp {
class PipelineExecutor;
}

namespace titan::train {

// Throws, naming `source`, the key and a fix, for a layout this build does not run (a pipeline
// schedule with too few micro-batches, sequences that do not split over TP or CP, ...):
// the trainer's first check (then that the data and tokenizer exist), and `titan plan`'s.
void check_supported(const JobConfig& c, const std::string& source);

struct TrainResult {
  int64_t last_step = 0;      // the last optimizer step completed
  double last_loss = 0;       // its training loss
  double last_val_loss = -1;  // the last validation loss (-1 if validation never ran)
  bool interrupted = false;   // stopped by Ctrl-C (after saving a checkpoint)
  std::filesystem::path run_folder;
  std::filesystem::path last_checkpoint;  // empty if none was written
};

class Trainer {
 public:
  // source: the config file's path, for messages. Builds the tokenizer (for the vocabulary),
  // model, optimizer and data loaders; resumes from the newest checkpoint when checkpointing is on.
  // The run spans `world` (default: every rank of the job), whose size the [parallelism] degrees
  // must multiply to; a test can run a 1-rank reference on a group of one beside a larger run.
  Trainer(const JobConfig& config, const std::string& source, const distributed::ProcessGroup* world = nullptr);
  ~Trainer();
  TrainResult train();
  // Called after every optimizer step (and its logging/checkpointing) with the step number.
  std::function<void(int64_t step)> on_step_end;
  // The model being trained (e.g. for a test's on_step_end to inspect its parameters).
  models::CausalLM& model();
  // Its optimizer (e.g. for a test to inspect its state).
  const optim::Optimizer& optimizer() const;
  // Under pipeline parallelism, the schedule's executor (its last step's times); else null.
  const distributed::pp::PipelineExecutor* pipeline_executor() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The quantize.* converters [model] converters names, with their [quantize.*] sections' keys
// (models/quantize.h). Throws for two recipes of one kind.
models::QuantizeOptions quantize_options(const JobConfig& c);

}  // namespace titan::train
