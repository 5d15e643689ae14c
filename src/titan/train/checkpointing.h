// A training run's checkpoints: what the trainer saves (model weights as this rank holds them,
// the optimizer state of the same slices, buffers, the train state) and how it loads any
// checkpoint back into whatever layout this run has (checkpoint/checkpoint.h reads the
// overlapping pieces), with the rules for MTP modules a checkpoint has or lacks.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <vector>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/checkpoint.h"
#include "titan/distributed/data_parallel.h"
#include "titan/models/causal_lm.h"
#include "titan/optim/optimizer.h"
#include "titan/train/config.h"

namespace titan::train {

struct RunParts {
  models::CausalLM& model;
  distributed::DataParallel& data_parallel;
  optim::Optimizer& optimizer;
  const distributed::ProcessGroup& world;
  // Whether this rank writes the model's buffers (one rank per pipeline stage; rank 0 without PP).
  bool writes_buffers = true;
  // Names the other pipeline ranks hold (null: none): a checkpoint's tensors this rank lacks.
  const std::set<std::string>* other_stages = nullptr;
};

// What this rank saves of step-<step>: its pieces of the weights (converted to export_dtype when
// model_only: the final export) and, unless model_only, of the optimizer state, with train_state.
checkpoint::SaveRequest run_checkpoint_request(int64_t step, const RunParts& parts, const JobConfig& config,
                                               const nlohmann::json& train_state, bool model_only, DType export_dtype);

// Saves step-<step>/ under root (collective over parts.world). model_only: the weights alone,
// converted to export_dtype (the final export); otherwise also the optimizer state and
// train_state. Returns the step folder.
std::filesystem::path save_run_checkpoint(const std::filesystem::path& root, int64_t step, const RunParts& parts,
                                          const JobConfig& config, const nlohmann::json& train_state, bool model_only,
                                          DType export_dtype);

// Loads the step folder into this run's parameters (and, unless model_only, the optimizer state:
// that of a checkpoint saved by another optimizer (train_state.json's "optimizer", AdamW when
// absent) is an error naming checkpoint.allow_optimizer_switch, or with that key dropped, the
// optimizer starting fresh).
// MTP modules the checkpoint has beyond model.mtp_layers are dropped, those it lacks keep their
// initialization (each said in one line), a module it has only part of is an error; MoE token
// counts of the current step keep their run-time values (those
// waiting from DeepSeek-V3.2's frozen warm-up steps load). Returns the checkpoint's train_state.json.
nlohmann::json load_run_checkpoint(const std::filesystem::path& folder, const RunParts& parts, const JobConfig& config,
                                   bool model_only);

// Whether a step folder holds the weights alone (checkpoint.last_save_model_only's final save, an
// export): a run cannot resume from it, having no optimizer or data state. A train_state.json
// that does not read counts as a full checkpoint, for loading to find it damaged.
bool is_weights_only(const std::filesystem::path& folder);

// The newest committed checkpoint under root, of a step no later than at_most, that a run can
// resume from; the weights-only ones newer than it are appended to *weights_only (when given).
std::optional<std::filesystem::path> newest_full_checkpoint(const std::filesystem::path& root, int64_t at_most,
                                                            std::vector<std::filesystem::path>* weights_only = nullptr);

// One rank's result of loading a checkpoint, in the form the ranks exchange: "" loaded,
// "C<message>" damaged (checksum, format), "M<file>\n<message>" a file it could not find,
// "I<message>" another I/O error (not damage), "E<message>" any other error.
std::string load_outcome(const std::function<void()>& load);

// What a load of `folder` came to over every rank's outcome, judged on one rank (rank 0): any other
// error fails the run; a file that no rank sees (seen_by_some_rank: every rank looked) is damage,
// as is a checksum or format failure; an I/O error, or a file hidden from some ranks only (a stale
// cache), fails the run and leaves the checkpoint in place.
struct LoadVerdict {
  enum class Kind { loaded, damaged, failed } kind = Kind::loaded;
  std::string report;  // per rank, what was wrong (damaged, failed)
};
LoadVerdict judge_load(const std::filesystem::path& folder, const std::vector<std::string>& outcomes,
                       const std::function<bool(const std::filesystem::path&)>& seen_by_some_rank);

}  // namespace titan::train
