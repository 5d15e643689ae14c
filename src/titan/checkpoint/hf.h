// Hugging Face model folders: config.json plus either model.safetensors or shards listed in
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: file}}). Reading
// handles DeepSeek's low-precision checkpoints: a weight W [R, C] stored as f8e4m3 (V3, V4) or
// as FP4 e2m1 (V4's routed experts: two values per int8 byte, the low nibble the even column)
// has block scales beside it, "<W>_scale_inv" (V3) or "<X>.scale" for W = "<X>.weight" (the V4
// release; transformers renames it <X>.weight_scale_inv), and the real weight is the stored value
// times its block's scale. A scale grid [ceil(R/128), ceil(C/128)] means 128 x 128 blocks (edge
// blocks ragged); an FP4 weight's grid means the blocks it divides W into evenly (1 x 32). Scales
// are f32, bf16 or UE8M0 (e8m0; u8 bytes b read as 2^(b - 127)). Model-specific names and config
// keys live in each model's hf_adapter; this file knows only the folder layout and the dtypes.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/safetensors.h"
#include "titan/kernels/quantize.h"

namespace titan::checkpoint {

inline constexpr int64_t kFp8BlockSize = 128;  // DeepSeek-V3's weight_block_size

class HfFolder {
 public:
  // Reads config.json and the index (or the single model.safetensors) and opens every shard.
  // Errors name the folder, and for a missing or unreadable shard the file and a tensor in it.
  static HfFolder open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& config() const { return config_; }
  // Every stored tensor name, including the scale companions.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  // Whether `name` is a weight's block scales ("<W>_scale_inv", or "<X>.scale" beside "<X>.weight"),
  // read with that weight by load_f32 rather than on its own.
  bool is_scale(const std::string& name) const;
  // The file (relative to dir) holding `name`; throws naming the folder when absent.
  const std::string& file_of(const std::string& name) const;
  // The stored shape (of the weight itself, whatever its dtype).
  Shape shape(const std::string& name) const;
  // The tensor as a new f32 tensor: f32/bf16/f16 converted; f8e4m3 and packed FP4 dequantized
  // with their block scales (required for them).
  Tensor load_f32(const std::string& name) const;
  // An integer tensor (a routing table) as a new i64 tensor from i32 or i64; throws naming the
  // folder for any other dtype.
  Tensor load_i64(const std::string& name) const;
  // quantization_config.weight_block_size (square blocks only), else kFp8BlockSize.
  int64_t fp8_block() const { return fp8_block_; }

 private:
  const SafetensorsFile& file(const std::string& name) const;
  std::string scale_of(const std::string& weight) const;  // its scales' name; empty when none
  std::filesystem::path dir_;
  nlohmann::json config_;
  int64_t fp8_block_ = kFp8BlockSize;
  std::map<std::string, std::string> file_of_;                            // tensor -> file
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;        // file -> open mapping
};

// w [R, C] f32 = values [R, C] (f8e4m3 or f4e2m1) * scales [SR, SC] per block: b x b blocks
// (block = b > 0; the grid must be [ceil(R/b), ceil(C/b)], edge blocks ragged), or, with block = 0,
// the R/SR x C/SC blocks the grid divides w into evenly. Scales are f32, bf16, e8m0 or u8 (UE8M0
// bytes). `what` names the tensor in errors.
Tensor dequantize_blocks(const Tensor& values, const Tensor& scales, const std::string& what,
                         int64_t block = kFp8BlockSize);
// Two FP4 e2m1 values per byte, the low nibble first (DeepSeek-V4's int8 expert weights):
// bytes [R, C/2] (u8) -> [R, C] f4e2m1.
Tensor unpack_fp4_bytes(const Tensor& bytes, const std::string& what);
// The inverse, DeepSeek's FP8 layout: w [R, C] -> {e4m3 codes [R, C], scales [ceil(R/b), ceil(C/b)]}
// with code = RNE(w / scale). ScaleRule::amax: f32 scales amax(block) / 448 (DeepSeek-V3's
// "_scale_inv"); ScaleRule::pow2: the power of two 2^ceil(log2(amax / 448)) as UE8M0 bytes (e8m0:
// the V4 release's ".scale"). An all-zero block gets scale 1.
std::pair<Tensor, Tensor> quantize_fp8_blocks(const Tensor& w, int64_t block = kFp8BlockSize,
                                              kernels::ScaleRule rule = kernels::ScaleRule::amax);
// DeepSeek-V4's FP4 experts: w [R, C] -> {codes [R, C] f4e2m1 (packed two per byte, the low nibble
// the even column), UE8M0 scales [R, C / b] (e8m0)} over 1 x b blocks, b = min(32, C) (C a multiple
// of b, and even): scale = 2^ceil(log2(amax / 6)) (1 for an all-zero block), so no value saturates
// (the OCP MX rule of kernels/quantize.h may), code = RNE_e2m1(w / scale).
std::pair<Tensor, Tensor> quantize_fp4_rows(const Tensor& w, int64_t block = 32);

// A quantized export stores the big matrices as DeepSeek releases them (each model's conversion
// says which): fp8, E4M3 with 128 x 128 block scales (V4: also its routed experts); fp8_fp4, V4's
// release (FP8, and the routed experts FP4 with 1 x 32 scales).
enum class HfQuantization : uint8_t { none, fp8, fp8_fp4 };

struct HfWriteOptions {
  DType dtype = DType::bf16;                  // stored dtype of float tensors (f32, bf16 or f16)
  HfQuantization quantize = HfQuantization::none;
  // The conversion chose each tensor's dtype (a release layout mixes f32, bf16 and FP8): none is cast.
  bool keep_dtypes = false;
  int64_t max_shard_bytes = int64_t(5) << 30;  // Hugging Face's default shard size
};

// Writes dir/config.json and the tensors (in order) as model.safetensors when they fit one
// shard, else as model-0000i-of-0000n.safetensors plus model.safetensors.index.json. Each file
// is written under a temporary name and renamed. Packed FP4 tensors (f4e2m1 [R, C]) are written
// as DeepSeek-V4 stores them: int8 bytes [R, C / 2] (safetensors "I8").
void save_hf_folder(const std::filesystem::path& dir, const nlohmann::json& config,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, const HfWriteOptions& options = {});

}  // namespace titan::checkpoint
