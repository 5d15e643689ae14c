#include "titan/checkpoint/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>

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

bool HfFolder::is_scale(const std::string& name) const {
  if (name.ends_with("_scale_inv")) return contains(name.substr(0, name.size() - 10));
  return name.ends_with(".scale") && contains(name.substr(0, name.size() - 6) + ".weight");
}

std::string HfFolder::scale_of(const std::string& weight) const {
  if (contains(weight + "_scale_inv")) return weight + "_scale_inv";
  if (weight.ends_with(".weight") && contains(weight.substr(0, weight.size() - 7) + ".scale"))
    return weight.substr(0, weight.size() - 7) + ".scale";
  return {};
}

Tensor HfFolder::load_f32(const std::string& name) const {
  const Tensor stored = file(name).get(name);
  const std::string where = "tensor '" + name + "' in " + (dir_ / file_of(name)).string();
  const std::string scale = scale_of(name);
  if (stored.dtype() == DType::f8e4m3) {
    TITAN_CHECK(!scale.empty(), where + " is fp8 e4m3 but has no '" + name + "_scale_inv' or '.scale' beside it",
                "DeepSeek's FP8 weights need their 128x128 block scales; the checkpoint is incomplete");
    return dequantize_blocks(stored, file(scale).get(scale), where, fp8_block_);
  }
  // DeepSeek-V4's FP4 experts: int8 (read as bytes) or e2m1 values, with their 1 x 32 scales.
  if (!scale.empty() && (stored.dtype() == DType::u8 || stored.dtype() == DType::f4e2m1)) {
    const Tensor values = stored.dtype() == DType::u8 ? unpack_fp4_bytes(stored, where) : stored;
    return dequantize_blocks(values, file(scale).get(scale), where, 0);
  }
  TITAN_CHECK(stored.dtype() == DType::f32 || stored.dtype() == DType::bf16 || stored.dtype() == DType::f16,
              where + " has dtype " + std::string(dtype_name(stored.dtype())) + ", which is not a weight type",
              "weights load from f32, bf16, f16, or block-scaled f8e4m3 / fp4");
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

Tensor unpack_fp4_bytes(const Tensor& bytes, const std::string& what) {
  TITAN_CHECK(bytes.dim() == 2 && bytes.is_contiguous(), what + ": packed FP4 weights must be contiguous 2-D bytes, got " + bytes.str(),
              "DeepSeek-V4 stores its FP4 experts as [rows, columns / 2] int8");
  Tensor out = Tensor::empty({bytes.size(0), 2 * bytes.size(1)}, DType::f4e2m1);
  std::memcpy(out.data_ptr(), bytes.data_ptr(), size_t(bytes.numel()));  // f4e2m1 keeps the low nibble first too
  return out;
}

namespace {

// One dimension of a block grid: n elements in s blocks, of `block` each (ragged last) when
// block > 0, else of n / s each (which must divide). 0 when the grid does not fit.
int64_t block_length(int64_t n, int64_t s, int64_t block) {
  if (block > 0) return s == ceil_div(n, block) ? block : 0;
  return s > 0 && n % s == 0 ? n / s : 0;
}

// UE8M0 bytes b as the scales 2^(b - 127) (0xff: NaN), or any float scales, as f32.
Tensor scales_f32(const Tensor& scales) {
  if (scales.dtype() != DType::u8) return scales.to(DType::f32);
  Tensor out = Tensor::empty(scales.shape(), DType::f32);
  const uint8_t* b = scales.data<uint8_t>();
  for (int64_t i = 0; i < scales.numel(); ++i) out.data<float>()[i] = e8m0_to_f32(e8m0{b[i]});
  return out;
}

}  // namespace

Tensor dequantize_blocks(const Tensor& values, const Tensor& scales, const std::string& what, int64_t block) {
  TITAN_CHECK((values.dtype() == DType::f8e4m3 || values.dtype() == DType::f4e2m1) && values.dim() == 2 &&
                  values.is_contiguous(),
              what + ": block-scaled weights must be contiguous 2-D f8e4m3 or f4e2m1, got " + values.str(),
              "only matrices are stored block-scaled in DeepSeek checkpoints");
  const int64_t rows = values.size(0), cols = values.size(1);
  const bool grid = scales.dim() == 2;
  const int64_t br = grid ? block_length(rows, scales.size(0), block) : 0;
  const int64_t bc = grid ? block_length(cols, scales.size(1), block) : 0;
  const DType sd = scales.dtype();
  const std::string want = block > 0 ? std::to_string(block) + "x" + std::to_string(block) + " blocks of " +
                                           values.shape().str() + " (want [" + std::to_string(ceil_div(rows, block)) +
                                           ", " + std::to_string(ceil_div(cols, block)) + "])"
                                     : "even blocks of " + values.shape().str();
  TITAN_CHECK(br > 0 && bc > 0 && (sd == DType::f32 || sd == DType::bf16 || sd == DType::e8m0 || sd == DType::u8),
              what + ": scales " + scales.str() + " do not fit " + want + " as f32, bf16 or e8m0",
              "the scales must come from the same export as the weight");
  const Tensor v = values.to(DType::f32), s = scales_f32(scales);
  const int64_t sc = scales.size(1);
  Tensor out = Tensor::empty({rows, cols}, DType::f32, MemCategory::parameters);
  const float* vp = v.data<float>();
  const float* sp = s.data<float>();
  float* o = out.data<float>();
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* srow = sp + (r / br) * sc;
      for (int64_t c = 0; c < cols; ++c) o[r * cols + c] = vp[r * cols + c] * srow[c / bc];
    }
  });
  return out;
}

std::pair<Tensor, Tensor> quantize_fp8_blocks(const Tensor& w, int64_t block, kernels::ScaleRule rule) {
  TITAN_CHECK(w.dim() == 2, "quantize_fp8_blocks: needs a matrix, got " + w.str(), "only 2-D weights are block-scaled");
  const Tensor x = w.to(DType::f32).contiguous();
  Tensor q = Tensor::empty(x.shape(), DType::f8e4m3);
  Tensor scale = Tensor::empty({ceil_div(x.size(0), block), ceil_div(x.size(1), block)}, DType::f32);
  kernels::fp8_block_quantize(q, scale, x, block, block, rule);
  if (rule == kernels::ScaleRule::amax) return {q, scale};
  Tensor bytes = Tensor::empty(scale.shape(), DType::e8m0);  // exact: every scale is a power of two
  for (int64_t i = 0; i < scale.numel(); ++i) bytes.data<e8m0>()[i] = f32_to_e8m0(scale.data<float>()[i]);
  return {q, bytes};
}

std::pair<Tensor, Tensor> quantize_fp4_rows(const Tensor& w, int64_t block) {
  const int64_t cols = w.dim() == 2 ? w.size(1) : 0, b = std::min(block, cols);
  TITAN_CHECK(w.dim() == 2 && cols % 2 == 0 && b > 0 && cols % b == 0,
              "quantize_fp4_rows: needs a matrix of even width, a multiple of " + std::to_string(b) + ", got " + w.str(),
              "DeepSeek-V4's FP4 experts have 1 x 32 blocks along the rows");
  const Tensor x = w.to(DType::f32).contiguous();
  const int64_t rows = x.size(0), blocks = cols / b;
  Tensor codes = Tensor::empty({rows, cols}, DType::f4e2m1), scales = Tensor::empty({rows, blocks}, DType::e8m0);
  auto* packed = static_cast<uint8_t*>(codes.data_ptr());
  std::memset(packed, 0, size_t(codes.nbytes()));
  const float* xp = x.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < blocks; ++k) {
      const float* v = xp + r * cols + k * b;
      float amax = 0;
      for (int64_t j = 0; j < b; ++j) amax = std::max(amax, std::fabs(v[j]));
      // 6: E2M1's largest value. The power of two in double, as DeepSeek's scripts compute it.
      const float s = amax > 0 ? float(std::exp2(std::ceil(std::log2(double(amax) / 6.0)))) : 1.0f;
      scales.data<e8m0>()[r * blocks + k] = f32_to_e8m0(s);
      for (int64_t j = 0; j < b; ++j) {
        const int64_t c = r * cols + k * b + j;
        packed[c / 2] |= uint8_t(f32_to_f4e2m1(v[j] / s) << (4 * (c % 2)));
      }
    }
  }
  return {codes, scales};
}

namespace {

// A packed FP4 tensor's bytes as u8 [R, C / 2], as safetensors files store them ("I8").
Tensor fp4_bytes(const Tensor& t) {
  Shape shape = t.shape();
  shape[shape.size() - 1] /= 2;
  Tensor out = Tensor::empty(shape, DType::u8);
  std::memcpy(out.data_ptr(), t.contiguous().data_ptr(), size_t(out.nbytes()));
  return out;
}

}  // namespace

void save_hf_folder(const fs::path& dir, const json& config, const std::vector<std::pair<std::string, Tensor>>& tensors,
                    const HfWriteOptions& options) {
  TITAN_CHECK(options.dtype == DType::f32 || options.dtype == DType::bf16 || options.dtype == DType::f16,
              "Hugging Face export dtype must be f32, bf16 or f16, got " + std::string(dtype_name(options.dtype)),
              "pass --dtype bf16 (the usual) or f32");
  TITAN_CHECK(options.max_shard_bytes > 0, "max_shard_bytes must be positive");
  fs::create_directories(dir);
  auto stored_dtype = [&](const Tensor& t) {
    const DType d = t.dtype();
    return !options.keep_dtypes && (d == DType::f32 || d == DType::bf16 || d == DType::f16) ? options.dtype : d;
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
    std::set<std::string> int8_bytes;
    for (size_t i : shards[s]) {
      const auto& [name, t] = tensors[i];
      if (t.dtype() == DType::f4e2m1) {
        part.emplace_back(name, fp4_bytes(t));
        int8_bytes.insert(name);
      } else {
        part.emplace_back(name, t.dtype() == stored_dtype(t) ? t : t.to(stored_dtype(t)));
      }
      weight_map[name] = file;
    }
    save_safetensors(dir / file, part, {{"format", "pt"}}, int8_bytes);
  }
  if (shards.size() > 1)
    write_text(dir / kIndexName, json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
}

}  // namespace titan::checkpoint
