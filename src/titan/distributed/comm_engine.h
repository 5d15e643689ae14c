// The communication thread of a process. It owns MPI: it initializes it (when the process was
// started by mpirun or srun), makes every MPI call, and finalizes it. ProcessGroups enqueue
// requests; the thread starts them in enqueue order (program order, the same on every rank),
// drives their progress with MPI_Test, sums reductions in rank order, counts each group's traffic
// per collective, records every request in the flight recorder, and is the watchdog: a request
// not finished within the timeout makes every rank dump its recorder and ends the job with one
// message naming the collective, its sequence id and the ranks that never arrived. A point-to-point
// transfer has its own sequence id, counted per (group, sender, receiver, tag): the n-th send of a
// channel is the n-th receive of its peer, so a stuck receive is reported against its send.
// The blocking MPI calls the thread makes (start-up, splits, the final barrier) have a deadline of
// their own (deadline.h), the start-up timeout. An exception on the thread (bad_alloc, a failed
// check) does not end the process: the thread dumps its flight recorder and fails every pending and
// later request with an error naming what failed, which their Work::wait throws.
//
// Without a launcher the engine runs without MPI: the world is one rank and every collective
// completes at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "titan/distributed/flight_recorder.h"
#include "titan/distributed/process_group.h"

namespace titan::distributed {

enum class CommOp : uint8_t {
  all_reduce, reduce_scatter, all_gather, all_gatherv, all_to_all, all_to_allv, broadcast, send, recv, barrier,
  split  // MPI_Comm_split for CommEngine::split (not counted as traffic)
};
const char* comm_op_name(CommOp op);

// One group's traffic for one kind of collective: calls, the bytes this rank sent (the payload
// handed to MPI, e.g. (N-1)/N of a reduce-scatter's input), and the time from issue to completion.
// cross_host_bytes: the part of `bytes` sent to ranks on other hosts (hosts as MPI sees them:
// the ranks that share memory). Exact for send and all-to-all(v); for the other collectives the
// bytes are taken as spread evenly over the other members (exact for pairwise algorithms, the
// average for rings and trees).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;
  int64_t cross_host_bytes = 0;
  double busy_seconds = 0;
};

// Element types a request moves (tensors' dtypes, plus host doubles and bytes).
enum class Elem : uint8_t { f32, bf16, f16, u16, f64, i32, i64, u8 };
size_t elem_bytes(Elem e);
Elem elem_of(DType dtype);

struct MpiHandles;  // comm_engine.cpp: the MPI requests of one Request
struct CommGroup;   // comm_engine.cpp: a group's communicators, sequence counters and traffic

// One enqueued operation. ProcessGroup fills the first block; the engine owns the rest.
struct Request {
  Request();
  ~Request();
  CommOp op = CommOp::barrier;
  ReduceOp reduce = ReduceOp::sum;
  Elem elem = Elem::f32;
  int group = 0;
  const void* in = nullptr;
  void* out = nullptr;
  int64_t in_elems = 0, out_elems = 0;
  Tensor keep_in, keep_out;  // the buffers stay alive until the request completes
  std::vector<int64_t> send_counts, recv_counts;  // all_to_allv / all_gatherv, in elements
  int peer = 0, tag = 0;  // send / recv peer (group rank) and tag; broadcast root

  CommGroup* split_child = nullptr;  // split: the new group (peer = color, tag = key)

  CommGroup* g = nullptr;  // set at enqueue (group objects never move)
  uint64_t seq = 0, record = 0, ar_index = 0;
  int stage = 0;
  double started = 0, deadline = 0;
  Tensor scratch, staging;  // u8 buffers from the tracked allocator (temporaries)
  std::shared_ptr<WorkState> work;
  std::unique_ptr<MpiHandles> mpi;
};

class CommEngine {
 public:
  static CommEngine& get();
  ~CommEngine();

  // Starts the communication thread; with use_mpi it initializes MPI first (blocking until done).
  // Creates the "world" group. Idempotent.
  void start(bool use_mpi);
  // Finishes what is queued, finalizes MPI and joins the thread. Idempotent.
  void stop();
  // Ends the whole job now (MPI_Abort) with `code`, after flushing stdout / stderr.
  [[noreturn]] void abort(int code);
  bool started() const { return thread_.joinable() || (started_ && !mpi_); }
  bool uses_mpi() const { return mpi_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  ProcessGroup& world();
  // The host of a world rank (the smallest world rank sharing its memory), and how many hosts the
  // job spans.
  int host_of(int world_rank) const { return host_of_.empty() ? 0 : host_of_[size_t(world_rank)]; }
  int hosts() const;

  // The sub-group of `parent` whose members passed the same color, ordered by key (MPI_Comm_split,
  // collective over parent: every member calls it, in the same order).
  std::unique_ptr<ProcessGroup> split(const ProcessGroup& parent, int color, int key, const std::string& name);

  // Watchdog and flight-recorder settings (TorchTitan's [comm] keys). The timeout applies to
  // requests issued from now on.
  void set_timeout(double seconds);
  // The deadline of the calls that block the communication thread (MPI_Init and the start-up
  // collectives, MPI_Comm_split / MPI_Comm_dup, the barrier and MPI_Finalize in stop()): the
  // start-up timeout (comm.init_timeout_seconds). Set it before start() to cover MPI's start-up.
  void set_init_timeout(double seconds);
  double init_timeout() const { return init_timeout_.load(); }
  // Where flight-recorder dumps go; default_trace_folder() until set.
  void set_trace_folder(const std::filesystem::path& folder);
  // <temp dir>/titan_comm_traces: for processes that are not a run (tests, tools).
  static std::filesystem::path default_trace_folder();
  void set_trace_buffer(size_t entries);
  FlightRecorder& recorder() { return recorder_; }

  // Traffic since start or the last reset, by (group name, op).
  std::map<std::pair<std::string, CommOp>, CommStats> stats() const;
  // The same summed over every group and op.
  CommStats total() const;
  void reset_stats();
  // Seconds callers spent blocked in Work::wait (exposed communication) since start.
  double exposed_seconds() const { return exposed_ns_.load() * 1e-9; }
  void add_exposed(double seconds) { exposed_ns_ += int64_t(seconds * 1e9); }
  // Work::wait brackets its blocking with these (a guard's two ends): the thread polls faster
  // while a caller waits.
  void caller_waits(bool starts);

  // Used by ProcessGroup: assigns the group's next sequence id, records the request and queues it
  // (or completes it at once for a one-rank group). Returns its Work.
  Work enqueue(std::unique_ptr<Request> request);

  // Test hook: the communication thread throws std::runtime_error(what) when it starts its next
  // request, as a real failure there (bad_alloc, a failed check) would.
  void fail_next_request_for_test(const std::string& what);

 private:
  CommEngine() = default;
  void loop();
  void init_mpi();
  void start_request(Request& r);
  bool progress(Request& r);  // true when r finished
  void finish_request(Request& r);
  void check_deadlines();
  void serve_control();
  static std::chrono::microseconds poll_pause(int idle_polls, bool caller_waiting);
  [[noreturn]] void fire(const Request& r);
  // The watchdog's message about a point-to-point request: its peer's progress on the channel.
  std::string who_missed_p2p(const Request& r, const std::map<int, nlohmann::json>& replies) const;
  void dump_recorder(const std::string& reason);
  // A blocking call that overran init_timeout(): says so, naming it, dumps the recorder when
  // `dump` (MPI is up) and ends the job.
  [[noreturn]] void expire_blocking(const std::string& what, double seconds, bool dump);
  // An exception escaped the thread's work on `current` (null: between requests): every pending
  // request fails with `what`, and so does every later one. Called from a catch handler, it throws
  // nothing, also when describing the failure or dumping the recorder fails (out of memory).
  void fail_thread(const Request* current, const char* phase, const char* what,
                   std::deque<std::unique_ptr<Request>>& incoming) noexcept;
  void fail_work(Request& r, std::string error) noexcept;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Request>> active_;  // started, in start order
  std::thread thread_;
  bool started_ = false, stopping_ = false, mpi_ = false, ready_ = false;
  int waiters_ = 0;               // callers blocked in Work::wait
  bool thread_multiple_ = false;  // MPI may be called from any thread (MPI_Abort from main)
  bool dumped_ = false;           // this rank's watchdog dumped its recorder (keep its reason)
  std::thread::id comm_thread_;
  int world_rank_ = 0, world_size_ = 1;
  std::vector<int> host_of_;  // per world rank; empty without MPI (one host)
  std::vector<std::unique_ptr<CommGroup>> groups_;
  std::unique_ptr<ProcessGroup> world_;
  std::atomic<double> timeout_{300.0};
  std::atomic<double> init_timeout_{300.0};
  std::string failed_;  // why the thread stopped serving requests (empty while it serves them)
  std::vector<std::unique_ptr<Request>> failed_requests_;  // kept: MPI may still use their buffers
  std::atomic<bool> inject_failure_{false};
  std::string injected_failure_;
  // Until a run sets its own (<job.dump_folder>/comm_traces): never the working directory, where
  // dumps of tests and tools would land in a checkout.
  std::filesystem::path trace_folder_ = default_trace_folder();
  FlightRecorder recorder_;
  std::atomic<int64_t> exposed_ns_{0};
  // The control channel (a duplicate of MPI_COMM_WORLD): dump requests and their replies.
  struct Control;
  std::unique_ptr<Control> control_;
};

}  // namespace titan::distributed
