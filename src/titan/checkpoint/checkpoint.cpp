#include "titan/checkpoint/checkpoint.h"

#include "titan/checkpoint/staged_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <thread>
#include <cstdint>
#include <fstream>
#include <sstream>


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

// Flushes a file's (or a folder's entries') writes to the disk, so a commit marker never reaches
// it before what it vouches for.
void sync_path(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0)
    throw IOError("cannot open " + p.string() + " to sync it: " + std::strerror(errno), "check the folder's permissions",
                  __FILE__, __LINE__);
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0)
    throw IOError("cannot sync " + p.string() + " to disk: " + std::strerror(err), "check free disk space", __FILE__, __LINE__);
}

[[noreturn]] void io_failed(const std::string& what, const std::error_code& ec, int line) {
  throw IOError(what + ": " + ec.message(), "check free disk space, permissions and the file system", __FILE__, line);
}

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
  f.close();  // a small file's write fails only when it is flushed, here
  if (f.fail()) throw IOError("cannot write " + p.string(), "check free disk space and permissions", __FILE__, __LINE__);
  sync_path(p);
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f.good())
    throw IOError("cannot read " + p.string() + ": " + std::strerror(errno), "check the file system and rerun", __FILE__,
                  __LINE__);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

[[noreturn]] void corrupt(const std::string& message, const std::string& hint, int line) {
  throw CorruptCheckpoint(message, hint, __FILE__, line);
}

json parse_json(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) {
    if (ec) io_failed("cannot look for " + p.string(), ec, __LINE__);
    corrupt(p.string() + " is missing", "the checkpoint is incomplete; load an earlier step", __LINE__);
  }
  try {
    return json::parse(read_text(p));
  } catch (const json::exception& e) {
    corrupt(p.string() + " is not valid JSON: " + e.what(), "the checkpoint is corrupt; load an earlier step", __LINE__);
  }
}

std::optional<int64_t> step_of(const fs::path& p) {
  const std::string n = p.filename().string();
  if (n.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = n.substr(5);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return std::nullopt;
  // from_chars, not stoll: a folder "step-99999999999999999999" is not a step, and no exception.
  int64_t step = 0;
  if (std::from_chars(digits.data(), digits.data() + digits.size(), step).ec != std::errc()) return std::nullopt;
  return step;
}

}  // namespace

fs::path step_folder(const fs::path& root, int64_t step) { return root / ("step-" + std::to_string(step)); }

namespace {

std::string shard_file(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d.safetensors", rank);
  return buf;
}

json shape_json(const Shape& s) {
  json j = json::array();
  for (int64_t d : s) j.push_back(d);
  return j;
}

Shape shape_of(const json& j) {
  std::vector<int64_t> d;
  for (const auto& x : j) d.push_back(x.get<int64_t>());
  return Shape(d);
}

// A piece's shape and dtype: its tensor's, or a streamed one's (f32).
Shape piece_shape(const ShardedTensor& st) { return st.local.defined() ? st.local.shape() : st.streamed_shape; }
DType piece_dtype(const ShardedTensor& st) { return st.local.defined() ? st.local.dtype() : DType::f32; }

// The pieces as metadata entries, given their checksums: {name: {dtype, shape, piece: {file,
// offsets, shape, xxh64}}}.
json describe_pieces(const std::vector<const ShardedTensor*>& pieces, const std::vector<uint64_t>& sums,
                     const std::string& file) {
  json out = json::object();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const ShardedTensor& st = *pieces[i];
    const Shape local = piece_shape(st);
    const Shape global = st.slice.global_shape.empty() && local.size() > 0 ? local : st.slice.global_shape;
    Shape offsets = st.slice.offsets;
    if (offsets.size() != local.size()) offsets = Shape(std::vector<int64_t>(size_t(local.size()), 0));
    TITAN_CHECK(!out.contains(st.name), "save_checkpoint: tensor '" + st.name + "' given twice by one rank");
    out[st.name] = {{"dtype", std::string(dtype_name(piece_dtype(st)))},
                    {"shape", shape_json(global)},
                    {"piece", {{"file", file}, {"offsets", shape_json(offsets)}, {"shape", shape_json(local)},
                               {"xxh64", hex64(sums[i])}}}};
  }
  return out;
}

// "" when `pieces` (each {offsets, shape}, sizes that is_extents accepted) lie inside `global`, do
// not overlap and cover it (then every element is read from exactly one piece), else what is wrong.
std::string tiling_error(const Shape& global, const json& pieces) {
  int64_t covered = 0;
  std::vector<std::pair<Shape, Shape>> boxes;
  for (const auto& piece : pieces) {
    const Shape off = shape_of(piece["offsets"]), ps = shape_of(piece["shape"]);
    if (off.size() != global.size() || ps.size() != global.size()) return "has a piece of another rank than " + global.str();
    for (int d = 0; d < global.size(); ++d)
      if (off[d] < 0 || off[d] + ps[d] > global[d]) return "has a piece outside its " + global.str();
    if (ps.numel() == 0) continue;
    for (const auto& [o, s] : boxes) {
      bool disjoint = false;
      for (int d = 0; d < global.size(); ++d) disjoint |= off[d] >= o[d] + s[d] || o[d] >= off[d] + ps[d];
      if (!disjoint) return "has two pieces that overlap, at offsets " + o.str() + " and " + off.str();
    }
    boxes.emplace_back(off, ps);
    covered += ps.numel();
  }
  if (covered != global.numel())
    return "has pieces that cover " + std::to_string(covered) + " of its " + std::to_string(global.numel()) + " elements";
  return {};
}

void check_tiling(const std::string& name, const Shape& global, const json& pieces) {
  const std::string error = tiling_error(global, pieces);
  TITAN_CHECK(error.empty(), "save_checkpoint: tensor '" + name + "' " + error + " (the ranks' pieces do not tile it)");
}

}  // namespace

fs::path staging_folder(const fs::path& root, int64_t step) { return step_folder(root, step).string() + ".tmp"; }

namespace {

// Moves the folder `from` to `to`, replacing a `to` that exists (a step saved again after a
// rollback) without a moment in which no `to` exists: the two are exchanged atomically where the
// file system can (RENAME_EXCHANGE), else the old one is renamed aside first. The old one is then
// removed.
void replace_folder(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  const bool exists = fs::exists(to, ec);
  if (ec) io_failed("cannot look for " + to.string(), ec, __LINE__);
  if (!exists) {
    fs::rename(from, to, ec);
    if (ec) io_failed("cannot rename " + from.string() + " to " + to.filename().string(), ec, __LINE__);
    return;
  }
  fs::path old = from;  // after the exchange, `from` holds the old folder
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
      io_failed("cannot exchange " + from.string() + " and " + to.filename().string(),
                std::error_code(errno, std::generic_category()), __LINE__);
    // No exchange on this file system (e.g. NFS): the old folder goes aside, then the new one in
    // (a crash between the two leaves step-N.replaced, which a start puts back: purge_abandoned).
    old = to.string() + ".replaced";
    fs::remove_all(old, ec);
    if (!ec) fs::rename(to, old, ec);
    if (!ec) fs::rename(from, to, ec);
    if (ec) io_failed("cannot replace " + to.string() + " by " + from.filename().string(), ec, __LINE__);
  }
  // The new folder is in place, committed: an old one that will not go is only worth a warning.
  fs::remove_all(old, ec);
  if (ec) std::fprintf(stderr, "warning: cannot remove the replaced checkpoint folder %s: %s\n", old.c_str(),
                       ec.message().c_str());
}

}  // namespace

std::string write_shard(const fs::path& tmp, const SaveRequest& req, int rank, int64_t staging_bytes,
                        const std::function<void()>& staged) {
  // The pieces with elements, in the request's order (the file's); where each request piece went.
  std::vector<const ShardedTensor*> mine;
  std::vector<HeaderEntry> entries;
  std::vector<int64_t> entry_of(req.tensors.size(), -1);
  for (size_t i = 0; i < req.tensors.size(); ++i) {
    const ShardedTensor& st = req.tensors[i];
    if (piece_shape(st).numel() == 0) continue;
    entry_of[i] = int64_t(mine.size());
    mine.push_back(&st);
    const size_t bytes = st.local.defined() ? st.local.nbytes() : size_t(st.streamed_shape.numel()) * sizeof(float);
    entries.push_back({st.name, piece_dtype(st), piece_shape(st), bytes});
  }
  const std::string file = shard_file(rank);
  std::vector<uint64_t> sums(mine.size());
  if (!mine.empty()) {
    StagedFile out(tmp / file, entries, {{"format", "pt"}}, staging_bytes);
    std::vector<std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)>> hash;
    for (size_t e = 0; e < mine.size(); ++e) {
      hash.emplace_back(XXH64_createState(), &XXH64_freeState);
      XXH64_reset(hash.back().get(), 0);
    }
    std::vector<int64_t> next(mine.size(), 0);  // a streamed piece's next element
    for (size_t e = 0; e < mine.size(); ++e) {
      if (!mine[e]->local.defined()) continue;
      const Tensor t = mine[e]->local.contiguous();
      XXH64_update(hash[e].get(), t.data_ptr(), t.nbytes());
      out.put(e, 0, t.data_ptr(), t.nbytes());
    }
    for (const StateStream& stream : req.streams)
      stream([&](size_t piece, int64_t begin, const float* values, int64_t n) {
        const int64_t e = entry_of.at(piece);
        if (e < 0) return;  // a piece without elements
        TITAN_CHECK(!mine[size_t(e)]->local.defined() && begin == next[size_t(e)] &&
                        begin + n <= mine[size_t(e)]->streamed_shape.numel(),
                    "save_checkpoint: '" + mine[size_t(e)]->name + "' streamed out of order");
        XXH64_update(hash[size_t(e)].get(), values, size_t(n) * sizeof(float));
        out.put(size_t(e), size_t(begin) * sizeof(float), values, size_t(n) * sizeof(float));
        next[size_t(e)] += n;
      });
    for (size_t e = 0; e < mine.size(); ++e)
      TITAN_CHECK(mine[e]->local.defined() || next[e] == mine[e]->streamed_shape.numel(),
                  "save_checkpoint: '" + mine[e]->name + "' was streamed " + std::to_string(next[e]) + " of " +
                      std::to_string(mine[e]->streamed_shape.numel()) + " elements");
    out.flush();
    if (staged) staged();
    out.finish();
    for (size_t e = 0; e < mine.size(); ++e) sums[e] = XXH64_digest(hash[e].get());
  } else if (staged) {
    staged();
  }
  return describe_pieces(mine, sums, file).dump();
}

fs::path commit_checkpoint(const fs::path& root, const SaveRequest& req, const std::vector<std::string>& pieces,
                           int world_size) {
  const fs::path final_dir = step_folder(root, req.step), tmp = staging_folder(root, req.step);
  json tensors = json::object();
  for (const std::string& text : pieces) {
    const json rank_pieces = json::parse(text);
    for (const auto& [name, e] : rank_pieces.items()) {
      if (!tensors.contains(name)) tensors[name] = {{"dtype", e["dtype"]}, {"shape", e["shape"]}, {"shards", json::array()}};
      TITAN_CHECK(tensors[name]["shape"] == e["shape"] && tensors[name]["dtype"] == e["dtype"],
                  "save_checkpoint: ranks disagree on the shape or dtype of '" + name + "'");
      tensors[name]["shards"].push_back(e["piece"]);
    }
  }
  // The pieces of every tensor tile it: a checkpoint that could not be loaded is never committed.
  for (const auto& [name, t] : tensors.items()) check_tiling(name, shape_of(t["shape"]), t["shards"]);
  write_text(tmp / "train_state.json", req.train_state.dump(1));
  write_text(tmp / "config.toml", req.config_toml);
  const json meta = {{"format", kFormat}, {"version", kVersion}, {"step", req.step}, {"world_size", world_size},
                     {"tensors", tensors}};
  sync_path(tmp);                                     // every rank's file entry, before the marker
  write_text(tmp / "metadata.json", meta.dump(1));  // last: the commit marker
  sync_path(tmp);
  replace_folder(tmp, final_dir);
  sync_path(root);
  return final_dir;
}

void make_staging_folder(const fs::path& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);  // one a save that never committed left
  if (!ec) fs::create_directories(tmp, ec);
  if (ec) io_failed("cannot create the checkpoint staging folder " + tmp.string(), ec, __LINE__);
}

fs::path save_checkpoint(const fs::path& root, const SaveRequest& req, const distributed::ProcessGroup* group,
                         int64_t staging_bytes) {
  const int rank = group ? group->rank() : 0, size = group ? group->size() : 1;
  const fs::path tmp = staging_folder(root, req.step);
  if (rank == 0) make_staging_folder(tmp);
  if (group) group->barrier().wait();
  const std::string pieces = write_shard(tmp, req, rank, staging_bytes);
  const std::vector<std::string> all = group ? group->all_gather(pieces) : std::vector<std::string>{pieces};
  if (rank == 0) commit_checkpoint(root, req, all, size);
  if (group) group->barrier().wait();
  return step_folder(root, req.step);
}

namespace {

// Pauses between the tries of an open the operating system refused, as shares of the retry time
// (set_io_retry_seconds: 2.5 s unless set): enough for a file descriptor or memory to be freed,
// or a network file system's cache to catch up.
constexpr double kRetryShares[] = {0.04, 0.16, 0.8};
std::atomic<double> g_retry_seconds{2.5};

void pause_before_retry(size_t attempt) {
  std::this_thread::sleep_for(std::chrono::duration<double>(kRetryShares[attempt] * g_retry_seconds.load()));
}

// metadata.json is checked whole when a reader opens it, so that reading it later can trust it:
// a damaged file whose JSON still parses fails here as CorruptCheckpoint naming the field or the
// tensor, not as nlohmann's exception (which the fallback to an earlier step does not catch) or
// as an overflow deep inside a read.
[[noreturn]] void damaged(const fs::path& meta, const std::string& what, int line) {
  corrupt(meta.string() + ": " + what, "the metadata is damaged; load an earlier step", line);
}

const json* field(const json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// An integer in [lo, hi]; a fraction, a string or an integer out of range is not.
bool is_int_in(const json* j, int64_t lo, int64_t hi) {
  if (j && j->is_number_unsigned()) return j->get<uint64_t>() <= uint64_t(hi) && int64_t(j->get<uint64_t>()) >= lo;
  return j && j->is_number_integer() && j->get<int64_t>() >= lo && j->get<int64_t>() <= hi;
}

// Up to kMaxDims sizes or offsets, each small enough that sums of two never overflow, and their
// product (the element count) neither, nor that count's bits (at most 64 per element).
bool is_extents(const json* j) {
  if (!j || !j->is_array() || j->size() > size_t(kMaxDims)) return false;
  int64_t numel = 1;
  for (const json& d : *j)
    if (!is_int_in(&d, 0, int64_t(1) << 62) || __builtin_mul_overflow(numel, d.get<int64_t>(), &numel) ||
        numel > INT64_MAX / 64)
      return false;
  return true;
}

void check_tensor_entry(const fs::path& meta, const std::string& name, const json& t) {
  const auto bad = [&](const std::string& why, int line) { damaged(meta, "tensor '" + name + "' " + why, line); };
  if (!t.is_object()) bad("is not an object", __LINE__);
  const json* dtype = field(t, "dtype");
  if (!dtype || !dtype->is_string()) bad("has no dtype", __LINE__);
  try {
    dtype_from_name(dtype->get<std::string>());
  } catch (const Error&) {
    bad("has an unknown dtype " + dtype->dump(), __LINE__);
  }
  if (!is_extents(field(t, "shape"))) bad("has a bad shape", __LINE__);
  const Shape global = shape_of(t.at("shape"));
  const json* shards = field(t, "shards");
  if (!shards || !shards->is_array()) bad("lists no pieces (\"shards\")", __LINE__);
  for (const json& piece : *shards) {
    const json* file = piece.is_object() ? field(piece, "file") : nullptr;
    const json* xxh64 = piece.is_object() ? field(piece, "xxh64") : nullptr;
    if (!file || !file->is_string() || !xxh64 || !xxh64->is_string() || !is_extents(field(piece, "offsets")) ||
        !is_extents(field(piece, "shape")))
      bad("has a malformed piece " + piece.dump().substr(0, 200), __LINE__);
    // A piece's file lies in the step folder: a name, not a path.
    const std::string f = file->get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos)
      bad("names a piece file \"" + f + "\" outside the step folder", __LINE__);
    const Shape off = shape_of(piece.at("offsets")), ps = shape_of(piece.at("shape"));
    if (off.size() != global.size() || ps.size() != global.size())
      bad("has a piece of another rank than its " + global.str(), __LINE__);
    for (int d = 0; d < global.size(); ++d)
      if (off[d] + ps[d] > global[d]) bad("has a piece outside its " + global.str(), __LINE__);
  }
  // Every element read from exactly one piece: overlapping pieces would leave a gap unread.
  if (const std::string error = tiling_error(global, *shards); !error.empty()) bad(error, __LINE__);
}

}  // namespace

void set_io_retry_seconds(double seconds) { g_retry_seconds.store(std::max(seconds, 0.0)); }

CheckpointReader::CheckpointReader(const fs::path& folder) : folder_(folder) {
  std::error_code ec;
  const bool is_folder = fs::is_directory(folder, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) io_failed("cannot look at " + folder.string(), ec, __LINE__);
  TITAN_CHECK(is_folder, "checkpoint folder " + folder.string() + " does not exist",
              "pass a step-<N> folder (or set checkpoint.load_step to an existing step)");
  const fs::path meta_path = folder / "metadata.json";
  for (size_t attempt = 0; !fs::exists(meta_path); ++attempt) {
    // Missing from this rank's view: lost, or hidden by a stale cache; the caller tells which.
    if (attempt == std::size(kRetryShares))
      throw CheckpointIOError(folder.string() + " has no metadata.json (" + std::to_string(attempt + 1) + " looks)",
                              "pass a complete step-<N> folder (a save that was cut short has none)", __FILE__, __LINE__,
                              meta_path);
    pause_before_retry(attempt);
  }
  const json meta = parse_json(meta_path);
  const json* format = meta.is_object() ? field(meta, "format") : nullptr;
  if (!format || *format != kFormat) damaged(meta_path, "not a titan checkpoint (format field)", __LINE__);
  const json* version = field(meta, "version");
  TITAN_CHECK(is_int_in(version, kVersion, kVersion), meta_path.string() + ": checkpoint version " +
                                                          (version ? version->dump() : "(none)") + " is not supported",
              "this build reads version " + std::to_string(kVersion));
  const json* step = field(meta, "step");
  const json* world_size = field(meta, "world_size");
  if (step && !is_int_in(step, 0, INT64_MAX)) damaged(meta_path, "\"step\" is " + step->dump(), __LINE__);
  if (world_size && !is_int_in(world_size, 1, INT32_MAX))
    damaged(meta_path, "\"world_size\" is " + world_size->dump(), __LINE__);
  step_ = step ? step->get<int64_t>() : 0;
  world_size_ = world_size ? world_size->get<int>() : 1;
  const json* tensors = field(meta, "tensors");
  if (!tensors || !tensors->is_object()) damaged(meta_path, "\"tensors\" is not an object", __LINE__);
  for (const auto& [name, entry] : tensors->items()) check_tensor_entry(meta_path, name, entry);
  tensors_ = *tensors;
}

std::vector<std::string> CheckpointReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_.items()) out.push_back(name);
  return out;
}

bool CheckpointReader::contains(const std::string& name) const { return tensors_.contains(name); }

Shape CheckpointReader::shape(const std::string& name) const {
  TITAN_CHECK(contains(name), "tensor '" + name + "' is not in checkpoint " + folder_.string(),
              "load a checkpoint of the same model");
  return shape_of(tensors_.at(name).at("shape"));
}

const SafetensorsFile& CheckpointReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it != files_.end()) return *it->second;
  const fs::path path = folder_ / name;
  const std::string hint = "the checkpoint stays in place: fix the file system (or free file descriptors or memory) and "
                           "rerun; `titan launch` retries by itself";
  for (size_t attempt = 0;; ++attempt) {
    try {
      return *files_.emplace(name, std::make_unique<SafetensorsFile>(SafetensorsFile::open(path))).first->second;
    } catch (const IOError& e) {  // refused by the OS (missing included): retried, never damage
      if (attempt == std::size(kRetryShares)) {
        const bool missing = !fs::exists(path);
        throw CheckpointIOError("checkpoint " + folder_.string() + ": " + e.message() + " (" +
                                    std::to_string(attempt + 1) + " tries)",
                                hint, __FILE__, __LINE__, missing ? path : fs::path());
      }
      pause_before_retry(attempt);
    } catch (const Error& e) {  // a truncated or garbled shard
      corrupt(e.message(), "the checkpoint's file is damaged; load an earlier step", __LINE__);
    }
  }
}

void CheckpointReader::read(const std::string& name, const Tensor& dst, const GlobalSlice* slice) {
  try {
    read_pieces(name, dst, slice);
  } catch (const json::exception& e) {  // a damaged metadata.json whose JSON still parses
    corrupt(folder_.string() + "/metadata.json, tensor '" + name + "': " + e.what(),
            "the metadata is damaged; load an earlier step", __LINE__);
  }
}

void CheckpointReader::read_pieces(const std::string& name, const Tensor& dst, const GlobalSlice* slice) {
  const Shape global = shape(name);
  std::vector<int64_t> lo(size_t(global.size()), 0);
  if (slice && !slice->offsets.empty()) lo.assign(slice->offsets.begin(), slice->offsets.end());
  // The model's tensor must be the saved one: the same global shape (a slice of it when sharded).
  const Shape want = slice && !slice->global_shape.empty() ? slice->global_shape : dst.shape();
  TITAN_CHECK(want == global, "checkpoint tensor '" + name + "' is " + global.str() + " but the model's is " + want.str(),
              "load a checkpoint of the same model and flavor");
  // An empty slice reads nothing, wherever it starts: FSDP gives the ranks past the end of a
  // tensor smaller than the group (mHC's scale [1] over 4 ranks) offsets beyond it.
  if (dst.numel() == 0) return;
  for (int d = 0; d < dst.dim(); ++d)
    TITAN_CHECK(lo[size_t(d)] >= 0 && lo[size_t(d)] + dst.size(d) <= global[d],
                "the slice of '" + name + "' at offset " + std::to_string(lo[size_t(d)]) + " of dim " + std::to_string(d) +
                    " overruns the saved " + global.str());
  int64_t covered = 0;
  for (const auto& piece : tensors_.at(name).at("shards")) {
    const Shape off = shape_of(piece.at("offsets")), ps = shape_of(piece.at("shape"));
    // The overlap of the piece [off, off + ps) with what dst holds [lo, lo + dst.shape), per dim.
    Tensor src_view, dst_view = dst;
    bool overlaps = true;
    std::vector<std::pair<int64_t, int64_t>> box;  // per dim: [begin, end) in global coordinates
    for (int d = 0; d < dst.dim(); ++d) {
      const int64_t b = std::max(off[d], lo[size_t(d)]), e = std::min(off[d] + ps[d], lo[size_t(d)] + dst.size(d));
      if (b >= e) overlaps = false;
      box.emplace_back(b, e);
    }
    if (!overlaps) continue;
    const std::string fname = piece.at("file").get<std::string>();
    const SafetensorsFile& f = file(fname);
    Tensor part;
    try {
      part = f.get(name);
      if (part.shape() != ps) TITAN_FAIL("is " + part.shape().str() + ", its metadata says " + ps.str());
    } catch (const Error& e) {  // the file's header and the metadata disagree: one of them is damaged
      corrupt("tensor '" + name + "' in " + (folder_ / fname).string() + ": " + e.message(),
              "the checkpoint is damaged; load an earlier step", __LINE__);
    }
    const std::string key = fname + "/" + name;
    if (!verified_[key]) {
      if (hex64(checksum(part)) != piece.at("xxh64").get<std::string>())
        corrupt("checksum mismatch for tensor '" + name + "' in " + (folder_ / fname).string(),
                "the file is corrupt (disk or copy error); load an earlier step", __LINE__);
      verified_[key] = true;
    }
    src_view = part;
    for (int d = 0; d < dst.dim(); ++d) {
      src_view = src_view.slice(d, box[size_t(d)].first - off[d], box[size_t(d)].second - off[d]);
      dst_view = dst_view.slice(d, box[size_t(d)].first - lo[size_t(d)], box[size_t(d)].second - lo[size_t(d)]);
    }
    dst_view.copy_(src_view);
    covered += dst_view.numel();
  }
  if (covered != dst.numel())
    corrupt("tensor '" + name + "' in " + folder_.string() + ": its pieces cover " + std::to_string(covered) + " of the " +
                std::to_string(dst.numel()) + " elements needed",
            "a shard file is missing from the checkpoint or its metadata.json is damaged; load an earlier step", __LINE__);
}

Tensor CheckpointReader::read_full(const std::string& name) {
  const Shape global = shape(name);
  const DType dt = dtype_from_name(tensors_.at(name).at("dtype").get<std::string>());
  // The pieces tile the tensor (checked on open); the files must hold them before the whole is
  // allocated, so that a metadata.json claiming terabytes fails here, not in the allocator.
  for (const auto& piece : tensors_.at(name).at("shards")) {
    const std::string fname = piece.at("file").get<std::string>();
    const SafetensorsFile& f = file(fname);
    const auto entry = f.entries().find(name);
    const Shape ps = shape_of(piece.at("shape"));
    if (ps.numel() > 0 && (entry == f.entries().end() || entry->second.shape != ps))
      corrupt("tensor '" + name + "' in " + (folder_ / fname).string() + ": the file does not hold the " + ps.str() +
                  " piece its metadata lists",
              "the checkpoint is damaged; load an earlier step", __LINE__);
  }
  Tensor full = Tensor::empty(global, dt, MemCategory::temporaries);
  read(name, full);
  return full;
}

LoadedCheckpoint load_checkpoint(const fs::path& folder, const std::function<bool(const std::string&)>& wanted) {
  CheckpointReader reader(folder);
  LoadedCheckpoint out;
  out.step = reader.step();
  for (const std::string& name : reader.names())
    if (!wanted || wanted(name)) out.tensors[name] = reader.read_full(name);
  out.train_state = load_train_state(folder);
  out.config_toml = load_config_toml(folder);
  return out;
}

nlohmann::json load_train_state(const fs::path& folder) {
  const fs::path path = folder / "train_state.json";
  const json state = parse_json(path);
  // Readers look fields up in it (trainer, generate, convert): anything but an object is damage.
  // null is a save without a train state (SaveRequest's default), the same as {}.
  if (state.is_null()) return json::object();
  if (!state.is_object())
    corrupt(path.string() + " holds " + state.type_name() + ", not an object", "the checkpoint is corrupt; load an earlier step",
            __LINE__);
  return state;
}

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

namespace {

// The folders of `root` as (step, path) for names "step-<N><suffix>" (the committed ones, with
// metadata.json, for suffix ""), oldest first; none when root does not exist. An error listing
// them is an IOError.
std::vector<std::pair<int64_t, fs::path>> step_folders(const fs::path& root, const std::string& suffix) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) {
    if (ec && ec != std::errc::no_such_file_or_directory) io_failed("cannot look at " + root.string(), ec, __LINE__);
    return out;
  }
  for (auto it = fs::directory_iterator(root, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.ends_with(suffix)) continue;
    name.resize(name.size() - suffix.size());
    const auto step = step_of(name);
    if (!step) continue;
    if (suffix.empty()) {
      std::error_code exists_ec;
      if (!fs::exists(it->path() / "metadata.json", exists_ec)) {
        if (exists_ec) io_failed("cannot look at " + it->path().string(), exists_ec, __LINE__);
        continue;
      }
    }
    out.emplace_back(*step, it->path());
  }
  if (ec) io_failed("cannot list " + root.string(), ec, __LINE__);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::optional<fs::path> latest_checkpoint(const fs::path& root, int64_t at_most) {
  std::optional<fs::path> best;
  for (const auto& [step, path] : step_folders(root, ""))
    if (step <= at_most) best = path;
  return best;
}

std::vector<std::pair<int64_t, fs::path>> committed_checkpoints(const fs::path& root) { return step_folders(root, ""); }

void keep_latest(const fs::path& root, int k) {
  if (k <= 0) return;
  const auto steps = step_folders(root, "");
  for (size_t i = 0; i + size_t(k) < steps.size(); ++i) {
    std::error_code ec;
    fs::remove_all(steps[i].second, ec);
    if (ec) io_failed("cannot remove the old checkpoint " + steps[i].second.string(), ec, __LINE__);
  }
}

std::vector<fs::path> purge_abandoned(const fs::path& root, int keep) {
  // A save that replaced step-N without an atomic exchange and was cut short between its two
  // renames left the old step-N only as step-N.replaced: it goes back first.
  for (const auto& [step, path] : step_folders(root, ".replaced")) {
    const fs::path folder = step_folder(root, step);
    std::error_code ec;
    if (!fs::exists(folder, ec) && !ec && fs::exists(path / "metadata.json", ec)) {
      fs::rename(path, folder, ec);
      if (ec) io_failed("cannot put " + path.string() + " back as " + folder.filename().string(), ec, __LINE__);
    }
  }
  std::vector<fs::path> removed;
  for (const char* suffix : {".tmp", ".corrupt", ".replaced"}) {
    const auto folders = step_folders(root, suffix);
    for (size_t i = 0; i + size_t(std::max(keep, 0)) < folders.size(); ++i) {
      std::error_code ec;
      fs::remove_all(folders[i].second, ec);
      if (ec) io_failed("cannot remove " + folders[i].second.string(), ec, __LINE__);
      removed.push_back(folders[i].second);
    }
  }
  return removed;
}

}  // namespace titan::checkpoint
