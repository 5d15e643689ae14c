// A checkpoint save that writes in the background while training goes on
// (checkpoint.async_mode = "async", TorchTitan's key).
//
// start() (collective) copies this rank's small live pieces (buffers: the forward changes them)
// into staging copies and hands the request to a writer thread; training goes on. The writer
// streams every piece through one staging buffer of checkpoint.staging_mib (checkpoint.h's
// write_shard): the weights and the optimizer state read in place, swapped optimizer moments
// straight from the swap file, chunk by chunk. Those change only in the optimizer step, so the
// step calls wait_staged() first: it returns once the writer has read the last of them (what is
// left then is the staging buffer's last write and the file's sync). So a save holds the staging
// buffer, not a copy of the state; its price is that a step which reaches its update before the
// writer has read everything waits for it. (TorchTitan's DCP async save copies the whole state
// dict into CPU memory first, pinned with async_with_pinned_mem, and its step waits for that
// copy: on a GPU the copy lives in host memory; here the host memory is what the run trains in.)
// Each rank's writer then syncs its file into step-<N>.tmp and writes its pieces' description
// (pieces-<rank>.json, renamed into place: the rank's "done"). Rank 0's writer then
// waits for every rank's description and commits the checkpoint (checkpoint.h: metadata.json
// written last, synced, the folder renamed), as soon as the last file is on disk, whatever the
// training loop is doing; only then does it count. At most one save is in flight: start() and
// finish() wait for the previous one. The writers do no communication (the checkpoint folder is
// shared, as every checkpoint's is); a rank whose write failed throws from its next poll().
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <exception>
#include <limits>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "titan/checkpoint/checkpoint.h"

namespace titan::checkpoint {

class AsyncSaver {
 public:
  // commit_timeout_seconds: how long rank 0 waits for the other ranks' files.
  // staging_bytes: the buffer the writer streams the file through (checkpoint.staging_mib).
  AsyncSaver(const distributed::ProcessGroup& group, double commit_timeout_seconds,
             int64_t staging_bytes = kDefaultStagingBytes)
      : group_(group), timeout_(commit_timeout_seconds), staging_bytes_(staging_bytes) {}
  // Joins the writer. A commit still waiting for other ranks' files gets 30 s more (their savers
  // finish too when the whole job ends, e.g. on an error every rank throws), then it is
  // abandoned and the save stays a .tmp folder.
  ~AsyncSaver();
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective. Waits for a save still in flight (its folder returned in `previous`), then stages
  // `request`'s tensors and starts writing them under root.
  void start(const std::filesystem::path& root, const SaveRequest& request,
             std::optional<std::filesystem::path>* previous = nullptr);
  // The save's folder once this rank's writer is done (on rank 0: committed), else nothing. Not
  // collective. Rethrows the writer's error.
  std::optional<std::filesystem::path> poll();
  // Waits for this rank's writer (rank 0: the commit) and returns the folder, if a save was in flight.
  std::optional<std::filesystem::path> finish();
  // Returns once the save in flight (if any) has read every piece of live state: call it before
  // anything changes the weights or the optimizer state (the optimizer step, a load). Not
  // collective; rethrows nothing (poll() and finish() report the writer's error).
  void wait_staged();
  bool in_flight() const { return in_flight_; }
  // Seconds the last start() took on this rank (what training waited for then).
  double staging_seconds() const { return staging_seconds_; }
  // Seconds wait_staged() has waited, over all saves.
  double waited_seconds() const { return waited_seconds_; }

 private:
  void write(const std::filesystem::path& tmp);
  std::filesystem::path done();
  void mark_state_read();

  const distributed::ProcessGroup& group_;
  const double timeout_;
  const int64_t staging_bytes_;
  std::filesystem::path root_;
  SaveRequest staged_;           // the pieces as copied (tensors: the staging buffers)
  std::vector<Tensor> buffers_;  // the staging buffers, reused while the pieces keep their shapes
  std::thread writer_;
  std::atomic<bool> written_{false};
  std::mutex mu_;
  std::condition_variable staged_cv_;
  bool state_read_ = true;  // the writer has read every piece of live state (under mu_)
  double waited_seconds_ = 0;
  std::atomic<int64_t> abandon_at_{std::numeric_limits<int64_t>::max()};  // steady_clock ns
  std::exception_ptr failure_;
  bool in_flight_ = false;
  double staging_seconds_ = 0;
};

}  // namespace titan::checkpoint
