// Hugging Face folders to and from titan checkpoints, through the model families' conversions
// (models/family.h): what `titan ckpt convert` runs, and the trainer for
// checkpoint.initial_load_in_hf / last_save_in_hf.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "titan/checkpoint/hf.h"

namespace titan::train {

struct HfImported {
  std::filesystem::path folder;  // the step folder written
  std::string model;             // the registered model that trains it ([model] name)
  size_t tensors = 0;
  int64_t mtp_layers = 0;
  std::string note;  // for the user when not empty (e.g. MTP weights the folder lacks)
};

// Converts the Hugging Face folder hf_dir into root/step-<step> (weights only; the HF config is
// recorded in its train_state, so the architecture travels with it). Throws, naming config.json,
// when no family reads its architecture.
HfImported import_hf_folder(const std::filesystem::path& hf_dir, const std::filesystem::path& root, int64_t step);

// Writes the model tensors of a checkpoint step folder as a Hugging Face folder; `flavor` (may
// be empty) overrides the one its config.toml names. Returns the tensors written.
size_t export_hf_folder(const std::filesystem::path& step_folder, const std::filesystem::path& hf_dir,
                        const std::string& flavor, const checkpoint::HfWriteOptions& options);

}  // namespace titan::train
