// Hugging Face model folders: config.json plus either model.safetensors or shards listed in
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}). Reading
// handles DeepSeek's FP8 checkpoints: an f8e4m3 weight W [R, C] with a companion
// "<W>_scale_inv" [ceil(R/128), ceil(C/128)] holds W / s per 128x128 block, so the real weight
// is fp8 * scale_inv of its block (edge blocks are ragged). Model-specific names and config keys
// live in each model's hf_adapter; this file knows only the folder layout and the dtypes.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/safetensors.h"

namespace titan::checkpoint {

inline constexpr int64_t kFp8BlockSize = 128;  // DeepSeek-V3's weight_block_size

class HfFolder {
 public:
  // Reads config.json and the index (or the single model.safetensors) and opens every shard.
  // Errors name the folder, and for a missing or unreadable shard the file and a tensor in it.
  static HfFolder open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // Every stored tensor name, including the "_scale_inv" companions.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  // The file (relative to dir) holding `name`; throws naming the folder when absent.
  const std::string& file_of(const std::string& name) const;
  // The stored shape (of the weight itself, whatever its dtype).
  Shape shape(const std::string& name) const;
  // The tensor as a new f32 tensor: f32/bf16/f16 converted; f8e4m3 dequantized with its
  // "<name>_scale_inv" blocks (required for fp8 weights).
  Tensor load_f32(const std::string& name) const;
  // An integer tensor (a routing table) as a new i64 tensor from i32 or i64; throws naming the
  // folder for any other dtype.
  Tensor load_i64(const std::string& name) const;
  // quantization_config.weight_block_size (square blocks only), else kFp8BlockSize.
  int64_t fp8_block() const { return fp8_block_; }

 private:
  const SafetensorsFile& file(const std::string& name) const;
  std::filesystem::path dir_;
  nlohmann::json config_;
  int64_t fp8_block_ = kFp8BlockSize;
  std::map<std::string, std::string> file_of_;                            // tensor -> file
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;        // file -> open mapping
};

// w [R, C] f32 = fp8 [R, C] (f8e4m3) * scale_inv [ceil(R/b), ceil(C/b)] (f32 or bf16) per b x b block.
// `what` names the tensor in errors.
Tensor dequantize_fp8_blocks(const Tensor& fp8, const Tensor& scale_inv, const std::string& what,
                             int64_t block = kFp8BlockSize);
// The inverse: scale_inv = amax(block) / 448 (1 for an all-zero block), fp8 = w / scale_inv.
// Returns {fp8 [R, C], scale_inv [ceil(R/b), ceil(C/b)] f32}.
std::pair<Tensor, Tensor> quantize_fp8_blocks(const Tensor& w, int64_t block = kFp8BlockSize);

struct HfWriteOptions {
  DType dtype = DType::bf16;                  // stored dtype of float tensors (f32, bf16 or f16)
  int64_t max_shard_bytes = int64_t(5) << 30;  // Hugging Face's default shard size
};

// Writes dir/config.json and the tensors (in order) as model.safetensors when they fit one
// shard, else as model-0000i-of-0000n.safetensors plus model.safetensors.index.json. Each file
// is written under a temporary name and renamed.
void save_hf_folder(const std::filesystem::path& dir, const nlohmann::json& config,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, const HfWriteOptions& options = {});

}  // namespace titan::checkpoint
