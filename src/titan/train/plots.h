// The plots of a run, drawn from its metrics.jsonl at the end of training (and by `titan plot`):
//   loss.png          training and validation loss, extra losses, grad norm and lr against step
//   throughput.png    tokens/s, MFU, step time and the time training was blocked in saves
//   memory.png        peak memory by category per step
//   expert_load.png   MoE models: per layer, the busiest expert's load over the mean, and the
//                     busiest and idlest expert's tokens
// and, for a memory snapshot JSON, a bar chart of its bytes by category and by allocating op.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace titan::train {

// Writes the plots of the metrics in `metrics_jsonl` into `folder`; returns the files written.
// When a step was logged twice (a run resumed from a checkpoint before it), the later line wins.
std::vector<std::filesystem::path> write_run_plots(const std::filesystem::path& metrics_jsonl,
                                                   const std::filesystem::path& folder);

// One PNG comparing runs (each a run folder with metrics.jsonl, labelled by its folder name): their
// training and validation losses against step, one line per run (`titan plot --compare`).
void write_comparison_plot(const std::filesystem::path& png, const std::string& title,
                           const std::vector<std::filesystem::path>& runs);

// <snapshot>.png beside a memory snapshot JSON (the trainer's [profiling] enable_memory_snapshot).
std::filesystem::path plot_memory_snapshot(const std::filesystem::path& snapshot_json);

}  // namespace titan::train
