// Training checkpoints: a folder <root>/step-<N>/ with
//   shard-<rank>.safetensors  the pieces rank <rank> holds (model parameters "model.<name>",
//                             optimizer state "optim.<name>", buffers), each a slice of a global
//                             tensor; a rank that holds nothing new (a replica) writes no file
//   metadata.json             format/version, world size, and per global tensor: dtype, global
//                             shape, and every piece's file, offsets, shape and xxh64 checksum
//   train_state.json          step, data-loader position, ... (free JSON owned by the trainer)
//   config.toml               the resolved run configuration
// Every rank writes its file into step-<N>.tmp and syncs it; rank 0 then writes the metadata of
// all pieces (last: it is the commit marker), syncs it and renames the folder, so a crash never
// leaves a half checkpoint that looks valid. Loading reads, for each tensor a rank needs, the
// pieces that overlap its slice, checking their checksums: a checkpoint of any mesh loads on any
// other; opening checks that the pieces of every tensor tile it (no overlap, no gap). A damaged one
// (checksum, format, unreadable metadata) throws CorruptCheckpoint, from which a trainer falls back
// to the step before. What the operating system refuses (EIO, EMFILE, ENOMEM, a file missing from
// this rank's view) is retried, then thrown as CheckpointIOError: not damage, the checkpoint stays.
#pragma once

#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/shape.h"
#include "titan/core/tensor.h"
#include "titan/distributed/process_group.h"

namespace titan::checkpoint {

// A checkpoint whose files are damaged or incomplete; the message names the folder, the file and
// the tensor.
class CorruptCheckpoint : public Error {
 public:
  using Error::Error;
};

// Reading a checkpoint failed for a reason outside it (the OS refused, after retries). `missing`
// names the file this rank could not find, when that was the failure: whether it is lost or only
// hidden from this rank (a stale cache) is for a rank that can see the folder to tell.
class CheckpointIOError : public IOError {
 public:
  CheckpointIOError(std::string message, std::string hint, const char* file, int line, std::filesystem::path missing = {})
      : IOError(std::move(message), std::move(hint), file, line), missing_(std::move(missing)) {}
  const std::filesystem::path& missing() const { return missing_; }

 private:
  std::filesystem::path missing_;
};

// How long a reader keeps retrying an open the OS refused before CheckpointIOError: 2.5 s over
// three retries unless set (0: no retry, e.g. a fuzz target). Process-wide.
void set_io_retry_seconds(double seconds);

// checkpoint.staging_mib's default: the buffer a save streams each rank's file through.
inline constexpr int64_t kDefaultStagingBytes = int64_t(256) << 20;

struct ShardedTensor {
  std::string name;
  Tensor local;        // this rank's part
  GlobalSlice slice;   // where it sits in the global tensor (default: the whole tensor)
  // `local` is a private copy, not live state: an async save writes it as it is, without a
  // staging copy, and lets it go once written.
  bool owned = false;
  // `local` is live state that only the optimizer step changes (weights, optimizer state): an
  // async save reads it in place while training goes on, the step waiting for it
  // (AsyncSaver::wait_staged); any other live piece (buffers) is copied when the save starts.
  bool until_step = false;
  // With `local` undefined: a piece not in memory (swapped optimizer state), f32 of this shape,
  // whose values one of SaveRequest::streams hands out.
  Shape streamed_shape = {};
};

// Hands the values of streamed pieces out: emit(piece, first element, values, count), each
// piece's elements in order (piece: an index into SaveRequest::tensors).
using StreamEmit = std::function<void(size_t piece, int64_t begin, const float* values, int64_t n)>;
using StateStream = std::function<void(const StreamEmit&)>;

struct SaveRequest {
  int64_t step = 0;
  std::vector<ShardedTensor> tensors;  // this rank's pieces
  std::vector<StateStream> streams;    // the values of the pieces with streamed_shape
  nlohmann::json train_state;          // rank 0's is written
  std::string config_toml;             // rank 0's is written
};

// Writes step-<request.step>/ under root. With a group, a collective over it: every member calls
// it with its own pieces (the pieces of all ranks must tile each global tensor exactly). Returns
// the final folder.
std::filesystem::path save_checkpoint(const std::filesystem::path& root, const SaveRequest& request,
                                      const distributed::ProcessGroup* group = nullptr,
                                      int64_t staging_bytes = kDefaultStagingBytes);

// The two halves of save_checkpoint, for a save that writes in the background (async_save.h).
// write_shard writes this rank's pieces into the staging folder `tmp` (step-<N>.tmp, which must
// exist), syncs the file, and returns the pieces' description; commit_checkpoint (one rank,
// given every rank's description) checks that the pieces tile each tensor, writes train_state,
// config and metadata.json last, syncs them and renames tmp to step-<N>.
std::filesystem::path staging_folder(const std::filesystem::path& root, int64_t step);
// Creates `tmp` empty (removing what a save that never committed left there).
void make_staging_folder(const std::filesystem::path& tmp);
// Every byte goes through one staging buffer of at most staging_bytes (the in-memory pieces copied
// in, the streamed ones emitted in); staged() is called once the last value has been read from
// the request (from then on its live state may change) and before the file is synced.
std::string write_shard(const std::filesystem::path& tmp, const SaveRequest& request, int rank,
                        int64_t staging_bytes = kDefaultStagingBytes, const std::function<void()>& staged = {});
std::filesystem::path commit_checkpoint(const std::filesystem::path& root, const SaveRequest& request,
                                        const std::vector<std::string>& pieces, int world_size);

// Reads a step folder's tensors, whole or by slices. Opening reads metadata.json; shard files
// open when first read. Every error names the folder, the file and the tensor.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& folder);
  const std::filesystem::path& folder() const { return folder_; }
  int64_t step() const { return step_; }
  int world_size() const { return world_size_; }
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  Shape shape(const std::string& name) const;  // global
  // Copies into dst the part of global tensor `name` at `slice` (null: dst is the whole tensor),
  // converting dtype, from every saved piece that overlaps it (their checksums checked once).
  void read(const std::string& name, const Tensor& dst, const GlobalSlice* slice = nullptr);
  Tensor read_full(const std::string& name);

 private:
  const SafetensorsFile& file(const std::string& name);
  void read_pieces(const std::string& name, const Tensor& dst, const GlobalSlice* slice);
  std::filesystem::path folder_;
  int64_t step_ = 0;
  int world_size_ = 1;
  nlohmann::json tensors_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, bool> verified_;  // "<file>/<tensor>" pieces whose checksum matched
};

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

// The newest complete step folder under root, if any (ignores *.tmp folders), of a step no later
// than at_most.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& root,
                                                       int64_t at_most = std::numeric_limits<int64_t>::max());

// Every complete step folder under root as (step, folder), oldest first; none when root does not
// exist.
std::vector<std::pair<int64_t, std::filesystem::path>> committed_checkpoints(const std::filesystem::path& root);

// Deletes all but the newest k complete step folders (k <= 0 keeps everything).
void keep_latest(const std::filesystem::path& root, int k);

// Deletes what failed saves and damaged checkpoints left under root (step-N.tmp, step-N.corrupt,
// step-N.replaced) but the newest `keep` of each kind, so that a crash loop cannot fill the disk;
// returns the folders deleted. A step-N.replaced whose step-N is missing (a save cut short while
// it replaced the folder) is put back first. Call it only while no save of this run is in flight.
std::vector<std::filesystem::path> purge_abandoned(const std::filesystem::path& root, int keep);

std::filesystem::path step_folder(const std::filesystem::path& root, int64_t step);

}  // namespace titan::checkpoint
