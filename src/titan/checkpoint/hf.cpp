#include "titan/checkpoint/hf.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "titan/core/error.h"
#include "titan/core/parallel.h"

namespace titan::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

json read_json(const fs::path& path) {
  std::ifstream in(path);
  TITAN_CHECK(in.good(), "cannot read " + path.string(), "check the file exists and is readable");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    TITAN_FAIL(path.string() + " is not valid JSON: " + e.what(), "the file is corrupt or truncated; download it again");
  }
}

// Writes text to path through a temporary name, so a crash never leaves a truncated file.
void write_text(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TITAN_CHECK(out.good(), "cannot create " + tmp.string(), "check the folder exists and is writable");
    out << text;
    out.flush();
    TITAN_CHECK(out.good(), "write failed for " + tmp.string(), "check free disk space");
  }
  fs::rename(tmp, path);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

HfFolder HfFolder::open(const fs::path& dir) {
  HfFolder h;
  h.dir_ = dir;
  TITAN_CHECK(fs::is_directory(dir), "Hugging Face folder " + dir.string() + " does not exist",
              "pass the folder that holds config.json and the *.safetensors files");
  TITAN_CHECK(fs::exists(dir / "config.json"), "no config.json in " + dir.string(),
              "a Hugging Face model folder has config.json beside its weights");
  h.config_ = read_json(dir / "config.json");
  if (h.config_.contains("quantization_config") && h.config_["quantization_config"].contains("weight_block_size")) {
    const json& b = h.config_["quantization_config"]["weight_block_size"];
    TITAN_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[0] == b[1] && b[0].get<int64_t>() > 0,
                (dir / "config.json").string() + ": quantization_config.weight_block_size " + b.dump() +
                    " is not a square block size",
                "DeepSeek's FP8 checkpoints use [128, 128]");
    h.fp8_block_ = b[0].get<int64_t>();
  }
  if (fs::exists(dir / kIndexName)) {
    const json index = read_json(dir / kIndexName);
    TITAN_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                (dir / kIndexName).string() + " has no \"weight_map\" object", "the index file is corrupt");
    for (const auto& [name, file] : index["weight_map"].items()) {
      TITAN_CHECK(file.is_string(), (dir / kIndexName).string() + ": weight_map entry '" + name + "' is not a file name");
      // A file beside the index, never a path out of the folder ("../x", "/etc/x", "a/b").
      const std::string f = file.get<std::string>();
      TITAN_CHECK(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos && f.find('\0') == std::string::npos,
                  (dir / kIndexName).string() + ": weight_map entry '" + name + "' names \"" + f +
                      "\", which is not a file in the folder",
                  "an index lists file names beside it (e.g. model-00001-of-00002.safetensors); the index is corrupt");
      h.file_of_[name] = f;
    }
  } else {
    TITAN_CHECK(fs::exists(dir / kSingleName), "no " + std::string(kSingleName) + " or " + kIndexName + " in " + dir.string(),
                "download the weights too, not only config.json");
    auto f = std::make_shared<SafetensorsFile>(SafetensorsFile::open(dir / kSingleName));
    for (const auto& [name, entry] : f->entries()) h.file_of_[name] = kSingleName;
    h.files_.emplace(kSingleName, std::move(f));
  }
  for (const auto& [name, file] : h.file_of_) {
    auto it = h.files_.find(file);
    if (it == h.files_.end()) {
      TITAN_CHECK(fs::exists(dir / file), "shard " + file + " (holding tensor '" + name + "') is missing from " + dir.string(),
                  "download every file listed in " + std::string(kIndexName));
      it = h.files_.emplace(file, std::make_shared<SafetensorsFile>(SafetensorsFile::open(dir / file))).first;
    }
    TITAN_CHECK(it->second->contains(name), "tensor '" + name + "' is listed in " + kIndexName + " under " + file +
                                                " but that file does not hold it",
                "the index and the shards come from different exports; download them again together");
  }
  return h;
}

std::vector<std::string> HfFolder::names() const {
  std::vector<std::string> out;
  out.reserve(file_of_.size());
  for (const auto& [name, file] : file_of_) out.push_back(name);
  return out;
}

const std::string& HfFolder::file_of(const std::string& name) const {
  const auto it = file_of_.find(name);
  TITAN_CHECK(it != file_of_.end(), "tensor '" + name + "' is not in the Hugging Face folder " + dir_.string(),
              "the checkpoint does not match the model config; check config.json against the weights");
  return it->second;
}

const SafetensorsFile& HfFolder::file(const std::string& name) const { return *files_.at(file_of(name)); }

Shape HfFolder::shape(const std::string& name) const { return file(name).entries().at(name).shape; }

Tensor HfFolder::load_f32(const std::string& name) const {
  const Tensor stored = file(name).get(name);
  const std::string where = "tensor '" + name + "' in " + (dir_ / file_of(name)).string();
  if (stored.dtype() == DType::f8e4m3) {
    const std::string scale = name + "_scale_inv";
    TITAN_CHECK(contains(scale), where + " is fp8 e4m3 but has no '" + scale + "'",
                "DeepSeek's FP8 weights need their 128x128 block scales; the checkpoint is incomplete");
    return dequantize_fp8_blocks(stored, file(scale).get(scale), where, fp8_block_);
  }
  TITAN_CHECK(stored.dtype() == DType::f32 || stored.dtype() == DType::bf16 || stored.dtype() == DType::f16,
              where + " has dtype " + std::string(dtype_name(stored.dtype())) + ", which is not a weight type",
              "weights load from f32, bf16, f16 or block-scaled f8e4m3");
  return stored.to(DType::f32);
}

Tensor HfFolder::load_i64(const std::string& name) const {
  const Tensor stored = file(name).get(name);
  TITAN_CHECK(stored.dtype() == DType::i32 || stored.dtype() == DType::i64,
              "tensor '" + name + "' in " + (dir_ / file_of(name)).string() + " has dtype " +
                  std::string(dtype_name(stored.dtype())) + ", not an integer type",
              "routing tables load from i32 or i64");
  return stored.to(DType::i64);
}

Tensor dequantize_fp8_blocks(const Tensor& fp8, const Tensor& scale_inv, const std::string& what, int64_t block) {
  TITAN_CHECK(fp8.dtype() == DType::f8e4m3 && fp8.dim() == 2 && fp8.is_contiguous(),
              what + ": block-scaled fp8 weights must be contiguous 2-D f8e4m3, got " + fp8.str(),
              "only matrices are stored as fp8 in DeepSeek checkpoints");
  const int64_t rows = fp8.size(0), cols = fp8.size(1), sr = ceil_div(rows, block), sc = ceil_div(cols, block);
  TITAN_CHECK(scale_inv.dim() == 2 && scale_inv.size(0) == sr && scale_inv.size(1) == sc &&
                  (scale_inv.dtype() == DType::f32 || scale_inv.dtype() == DType::bf16),
              what + ": scale_inv " + scale_inv.str() + " does not fit " + std::to_string(block) + "x" +
                  std::to_string(block) + " blocks of " + fp8.shape().str() + " (want f32 [" + std::to_string(sr) +
                  ", " + std::to_string(sc) + "])",
              "the scales must come from the same export as the weight");
  const Tensor s = scale_inv.to(DType::f32);
  Tensor out = Tensor::empty({rows, cols}, DType::f32, MemCategory::parameters);
  const f8e4m3* q = fp8.data<f8e4m3>();
  const float* sp = s.data<float>();
  float* o = out.data<float>();
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* srow = sp + (r / block) * sc;
      for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = f8e4m3_to_f32(q[r * cols + c]) * srow[c / block];
    }
  });
  return out;
}

std::pair<Tensor, Tensor> quantize_fp8_blocks(const Tensor& w, int64_t block) {
  TITAN_CHECK(w.dim() == 2, "quantize_fp8_blocks: needs a matrix, got " + w.str(), "only 2-D weights are block-scaled");
  const Tensor x = w.to(DType::f32);
  const int64_t rows = x.size(0), cols = x.size(1), sr = ceil_div(rows, block), sc = ceil_div(cols, block);
  Tensor q = Tensor::empty({rows, cols}, DType::f8e4m3), scale = Tensor::empty({sr, sc}, DType::f32);
  const float* xp = x.data<float>();
  float* sp = scale.data<float>();
  for (int64_t bi = 0; bi < sr; ++bi) {
    for (int64_t bj = 0; bj < sc; ++bj) {
      float amax = 0;
      for (int64_t r = bi * block; r < std::min(rows, (bi + 1) * block); ++r)
        for (int64_t c = bj * block; c < std::min(cols, (bj + 1) * block); ++c) amax = std::max(amax, std::fabs(xp[r * cols + c]));
      sp[bi * sc + bj] = amax > 0 ? amax / 448.0f : 1.0f;  // 448: the largest finite e4m3 value
    }
  }
  f8e4m3* qp = q.data<f8e4m3>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) qp[r * cols + c] = f32_to_f8e4m3(xp[r * cols + c] / sp[(r / block) * sc + c / block]);
  return {q, scale};
}

void save_hf_folder(const fs::path& dir, const json& config, const std::vector<std::pair<std::string, Tensor>>& tensors,
                    const HfWriteOptions& options) {
  TITAN_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16 || options.dtype == DType::f16,
              "Hugging Face export dtype must be f32, bf16 or f16, got " + std::string(dtype_name(options.dtype)),
              "pass --dtype bf16 (the usual) or f32");
  TITAN_CHECK(options.max_shard_bytes > 0, "max_shard_bytes must be positive");
  fs::create_directories(dir);
  auto stored_dtype = [&](const Tensor& t) {
    const DType d = t.dtype();
    return d == DType::f32 || d == DType::bf16 || d == DType::f16 ? options.dtype : d;
  };
  // Shards in order: a new one starts when the next tensor would push this one past the limit.
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = tensors[i].second.numel() * dtype_bits(stored_dtype(tensors[i].second)) / 8;
    if (!shards.back().empty() && shard_bytes + n > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += n;
    total += n;
  }
  write_text(dir / "config.json", config.dump(2) + "\n");
  // A stale index or single file from an earlier export would shadow or contradict this one.
  for (const char* stale : {kIndexName, kSingleName}) fs::remove(dir / stale);
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? std::string(kSingleName) : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<std::pair<std::string, Tensor>> part;
    for (size_t i : shards[s]) {
      const auto& [name, t] = tensors[i];
      part.emplace_back(name, t.dtype() == stored_dtype(t) ? t : t.to(stored_dtype(t)));
      weight_map[name] = file;
    }
    save_safetensors(dir / file, part, {{"format", "pt"}});
  }
  if (shards.size() > 1)
    write_text(dir / kIndexName, json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
}

}  // namespace titan::checkpoint
