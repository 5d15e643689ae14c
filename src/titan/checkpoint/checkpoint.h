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
#include <functional>
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

// Loads the step folder `folder`: every tensor, or those `wanted` accepts (the others are neither
// read nor checked, e.g. the optimizer state when only the weights are needed).
LoadedCheckpoint load_checkpoint(const std::filesystem::path& folder,
                                 const std::function<bool(const std::string&)>& wanted = {});

// Only the train_state.json of a step folder (e.g. the architecture a converted checkpoint
// records), without reading its tensors.
nlohmann::json load_train_state(const std::filesystem::path& folder);
// Its config.toml ("" when it has none).
std::string load_config_toml(const std::filesystem::path& folder);

// `path` itself when it is a step folder (it holds metadata.json), else the newest step folder
// under it; throws naming the path when it is neither.
std::filesystem::path resolve_step_folder(const std::filesystem::path& path);

// The newest complete step folder under root, if any (ignores *.tmp folders).
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root);

// Deletes all but the newest k complete step folders (k <= 0 keeps everything).
void keep_latest(const std::filesystem::path& root, int k);

std::filesystem::path step_folder(const std::filesystem::path& root, int64_t step);

}  // namespace titan::checkpoint
