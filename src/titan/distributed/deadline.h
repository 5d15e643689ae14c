// A deadline on an operation that cannot be interrupted: a blocking MPI call (MPI_Init, a
// start-up collective, MPI_Comm_split / MPI_Comm_dup, MPI_Finalize). The communication thread's
// watchdog polls the requests it started, but while it sits inside such a call it polls nothing;
// a Deadline watches from its own thread instead and, when the call overruns, runs `on_expire`,
// which is expected to say what hung and end the process (CommEngine's expiry does: a message
// naming the operation, a flight-recorder dump, MPI_Abort).
//
//   { Deadline d("MPI_Comm_split of group world", timeout, expire); MPI_Comm_split(...); }
//
// It costs a thread per guarded operation: for start-up and shutdown, never for a step's
// collectives (those have the watchdog).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace titan::distributed {

class Deadline {
 public:
  // on_expire(what, seconds) runs on the deadline's own thread once `seconds` passed without the
  // Deadline being destroyed. A non-positive `seconds` waits forever.
  using Expire = std::function<void(const std::string& what, double seconds)>;
  Deadline(std::string what, double seconds, Expire on_expire);
  // Disarms the deadline (at once: it does not wait for the time to pass), or, when on_expire
  // already runs and returns, waits for it.
  ~Deadline();
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  bool expired() const;

 private:
  std::string what_;
  double seconds_;
  Expire on_expire_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, expired_ = false;
  std::thread thread_;
};

}  // namespace titan::distributed
