#include "titan/checkpoint/checkpoint.h"

#include <xxhash.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "titan/checkpoint/safetensors.h"

namespace titan::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "titan-checkpoint";
constexpr int kVersion = 1;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t checksum(const Tensor& t) {
  Tensor c = t.contiguous();
  return XXH64(c.data_ptr(), c.nbytes(), 0);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  TITAN_CHECK(f.good(), "cannot write " + p.string(), "check free disk space and permissions");
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  TITAN_CHECK(f.good(), "cannot read " + p.string(), "the checkpoint folder is incomplete; pick another step");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const fs::path& p) {
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    TITAN_FAIL(p.string() + " is not valid JSON: " + e.what(), "the checkpoint is corrupt; load an earlier step");
  }
}

std::optional<int64_t> step_of(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = n.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
  return std::stoll(digits);
}

}  // namespace

fs::path step_folder(const fs::path& root, int64_t step) { return root / ("step-" + std::to_string(step)); }

fs::path save_checkpoint(const fs::path& root, const SaveRequest& req) {
  const fs::path final_dir = step_folder(root, req.step);
  const fs::path tmp = final_dir.string() + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const std::string shard = "shard-00000.safetensors";
  std::vector<std::pair<std::string, Tensor>> items;
  json tensors = json::object();
  for (const ShardedTensor& st : req.tensors) {
    const Shape global = st.slice.global_shape.empty() && st.local.dim() > 0 ? st.local.shape() : st.slice.global_shape;
    Shape offsets = st.slice.offsets;
    if (offsets.size() != st.local.dim()) offsets = Shape(std::vector<int64_t>(size_t(st.local.dim()), 0));
    items.emplace_back(st.name, st.local);
    json shape = json::array(), off = json::array(), local = json::array();
    for (int64_t d : global) shape.push_back(d);
    for (int64_t d : offsets) off.push_back(d);
    for (int64_t d : st.local.shape()) local.push_back(d);
    tensors[st.name] = {{"dtype", std::string(dtype_name(st.local.dtype()))},
                        {"shape", shape},
                        {"shards", json::array({{{"file", shard}, {"offsets", off}, {"shape", local},
                                                 {"xxh64", hex64(checksum(st.local))}}})}};
  }
  save_safetensors(tmp / shard, items, {{"format", "pt"}});
  const json meta = {{"format", kFormat}, {"version", kVersion}, {"step", req.step}, {"world_size", 1},
                     {"tensors", tensors}};
  write_text(tmp / "metadata.json", meta.dump(1));
  write_text(tmp / "train_state.json", req.train_state.dump(1));
  write_text(tmp / "config.toml", req.config_toml);
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  return final_dir;
}

LoadedCheckpoint load_checkpoint(const fs::path& folder, const std::function<bool(const std::string&)>& wanted) {
  TITAN_CHECK(fs::is_directory(folder), "checkpoint folder " + folder.string() + " does not exist",
              "pass a step-<N> folder (or set checkpoint.load_step to an existing step)");
  const fs::path meta_path = folder / "metadata.json";
  TITAN_CHECK(fs::exists(meta_path), folder.string() + " has no metadata.json",
              "this is not a complete titan checkpoint; load an earlier step");
  const json meta = parse_json(meta_path);
  TITAN_CHECK(meta.value("format", "") == kFormat, meta_path.string() + ": not a titan checkpoint (format field)");
  TITAN_CHECK(meta.value("version", 0) == kVersion, meta_path.string() + ": checkpoint version " +
                                                         std::to_string(meta.value("version", 0)) + " is not supported",
              "this build reads version " + std::to_string(kVersion));
  LoadedCheckpoint out;
  out.step = meta.value("step", int64_t(0));
  std::map<std::string, SafetensorsFile> files;
  for (const auto& [name, spec] : meta.at("tensors").items()) {
    if (wanted && !wanted(name)) continue;
    Shape global;
    for (const auto& d : spec.at("shape")) global.push_back(d.get<int64_t>());
    const DType dt = dtype_from_name(spec.at("dtype").get<std::string>());
    Tensor full = Tensor::empty(global, dt, MemCategory::temporaries);
    int64_t covered = 0;
    for (const auto& sh : spec.at("shards")) {
      const std::string file = sh.at("file").get<std::string>();
      if (!files.count(file)) files.emplace(file, SafetensorsFile::open(folder / file));
      const SafetensorsFile& f = files.at(file);
      Tensor part = f.get(name);
      const std::string expected = sh.at("xxh64").get<std::string>();
      TITAN_CHECK(hex64(checksum(part)) == expected, "checksum mismatch for tensor '" + name + "' in " +
                                                         (folder / file).string(),
                  "the file is corrupt (disk or copy error); load an earlier step");
      Tensor dst = full;
      int d = 0;
      for (const auto& o : sh.at("offsets")) {
        dst = dst.slice(d, o.get<int64_t>(), o.get<int64_t>() + part.size(d));
        ++d;
      }
      dst.copy_(part);
      covered += part.numel();
    }
    TITAN_CHECK(covered == full.numel(), "tensor '" + name + "' in " + meta_path.string() +
                                             ": its shards cover " + std::to_string(covered) + " of " +
                                             std::to_string(full.numel()) + " elements",
                "a shard file is missing from the checkpoint");
    out.tensors[name] = full;
  }
  out.train_state = load_train_state(folder);
  out.config_toml = load_config_toml(folder);
  return out;
}

nlohmann::json load_train_state(const fs::path& folder) { return parse_json(folder / "train_state.json"); }

std::string load_config_toml(const fs::path& folder) {
  return fs::exists(folder / "config.toml") ? read_text(folder / "config.toml") : std::string();
}

fs::path resolve_step_folder(const fs::path& path) {
  if (fs::exists(path / "metadata.json")) return path;
  const auto latest = latest_checkpoint(path);
  TITAN_CHECK(latest.has_value(), path.string() + " is neither a checkpoint step folder nor holds one",
              "pass e.g. outputs/<run>/checkpoint/step-N");
  return *latest;
}

std::optional<fs::path> latest_checkpoint(const fs::path& root) {
  if (!fs::is_directory(root)) return std::nullopt;
  std::optional<std::pair<int64_t, fs::path>> best;
  for (const auto& e : fs::directory_iterator(root)) {
    const auto step = step_of(e.path());
    if (!step || !fs::exists(e.path() / "metadata.json")) continue;
    if (!best || *step > best->first) best = {*step, e.path()};
  }
  if (!best) return std::nullopt;
  return best->second;
}

void keep_latest(const fs::path& root, int k) {
  if (k <= 0 || !fs::is_directory(root)) return;
  std::vector<std::pair<int64_t, fs::path>> steps;
  for (const auto& e : fs::directory_iterator(root))
    if (auto s = step_of(e.path()); s && fs::exists(e.path() / "metadata.json")) steps.emplace_back(*s, e.path());
  std::sort(steps.begin(), steps.end());
  for (size_t i = 0; i + size_t(k) < steps.size(); ++i) fs::remove_all(steps[i].second);
}

}  // namespace titan::checkpoint
