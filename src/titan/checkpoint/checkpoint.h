// Training checkpoints: a folder <root>/step-<N>/ with
//   shard-<rank>.safetensors  this rank's tensors (model parameters "model.<name>", optimizer
//                             state "optim.<name>"), each a slice of a global tensor
//   metadata.json             format/version, world size, and per global tensor: dtype, global
//                             shape, and every shard's file, offsets, shape and xxh64 checksum
//   train_state.json          step, RNG and data-loader positions, schedule, loss scale... (free
//                             JSON owned by the trainer)
//   config.toml               the resolved run configuration
// The folder is written as step-<N>.tmp and renamed when complete, so a crash never leaves a
// half checkpoint that looks valid. Loading checks every checksum and assembles global tensors
// from the shards' slices, so a checkpoint loads whatever the shard layout it was saved with.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/shape.h"
#include "titan/core/tensor.h"

namespace titan::checkpoint {

struct ShardedTensor {
  std::string name;
  Tensor local;        // this rank's part
  GlobalSlice slice;   // where it sits in the global tensor (default: the whole tensor)
};

struct SaveRequest {
  int64_t step = 0;
  std::vector<ShardedTensor> tensors;
  nlohmann::json train_state;
  std::string config_toml;
};

// Single-process save (rank 0 of 1). Returns the final folder.
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const SaveRequest& request);

struct LoadedCheckpoint {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;  // global tensors by name
  nlohmann::json train_state;
  std::string config_toml;
};

// Loads <root>/step-<step>/ (or the folder itself when `folder` already is a step folder).
LoadedCheckpoint load_checkpoint(const std::filesystem::path& folder);

// Only the train_state.json of a step folder (e.g. the architecture a converted checkpoint
// records), without reading its tensors.
nlohmann::json load_train_state(const std::filesystem::path& folder);

// The newest complete step folder under root, if any (ignores *.tmp folders).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

// Deletes all but the newest k complete step folders (k <= 0 keeps everything).
void keep_latest(const std::filesystem::path& root, int k);

std::filesystem::path step_folder(const std::filesystem::path& root, int64_t step);

}  // namespace titan::checkpoint
