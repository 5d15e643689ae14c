// A checkpoint save that writes in the background while training goes on
// (checkpoint.async_mode = "async", TorchTitan's key).
//
// start() (collective) copies this rank's pieces into staging buffers (kept from one save to the
// next, so the steady state allocates nothing) and hands them to a writer thread; training goes
// on. Each rank's writer writes and syncs its file into step-<N>.tmp, then its pieces'
// description (pieces-<rank>.json, renamed into place: the rank's "done"). Rank 0's writer then
// waits for every rank's description and commits the checkpoint (checkpoint.h: metadata.json
// written last, synced, the folder renamed), as soon as the last file is on disk, whatever the
// training loop is doing; only then does it count. At most one save is in flight: start() and
// finish() wait for the previous one. The writers do no communication (the checkpoint folder is
// shared, as every checkpoint's is); a rank whose write failed throws from its next poll().
#pragma once

#include <atomic>
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
  AsyncSaver(const distributed::ProcessGroup& group, double commit_timeout_seconds)
      : group_(group), timeout_(commit_timeout_seconds) {}
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
  bool in_flight() const { return in_flight_; }
  // Seconds the last start() took on this rank (the staging copy: what training waited for).
  double staging_seconds() const { return staging_seconds_; }

 private:
  void write(const std::filesystem::path& tmp);
  std::filesystem::path done();

  const distributed::ProcessGroup& group_;
  const double timeout_;
  std::filesystem::path root_;
  SaveRequest staged_;           // the pieces as copied (tensors: the staging buffers)
  std::vector<Tensor> buffers_;  // the staging buffers, reused while the pieces keep their shapes
  std::thread writer_;
  std::atomic<bool> written_{false};
  std::atomic<int64_t> abandon_at_{std::numeric_limits<int64_t>::max()};  // steady_clock ns
  std::exception_ptr failure_;
  bool in_flight_ = false;
  double staging_seconds_ = 0;
};

}  // namespace titan::checkpoint
