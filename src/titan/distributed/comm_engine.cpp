#include "titan/core/clock.h"
#include "titan/distributed/comm_engine.h"

#include <mpi.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <list>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/core/trace.h"
#include "titan/distributed/deadline.h"
#include "titan/distributed/runtime.h"

namespace titan::distributed {

namespace fs = std::filesystem;
using nlohmann::json;

struct WorkState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // set when the request failed (the communication thread stopped): wait() throws it
};

struct MpiHandles {
  std::vector<MPI_Request> requests;
};

Request::Request() = default;
Request::~Request() = default;

struct CommGroup {
  std::string name;
  std::vector<int> world_ranks;
  int rank = 0;
  MPI_Comm comm = MPI_COMM_NULL;   // every request's first stage
  MPI_Comm comm2 = MPI_COMM_NULL;  // all-reduce's all-gather stage, started in all-reduce order
  uint64_t next_seq = 0, next_all_reduce = 0, all_reduce_stage2_started = 0;
  // Point-to-point sequence ids per channel: (sender, receiver, tag), in group ranks.
  std::map<std::tuple<int, int, int>, uint64_t> p2p_seq;
  int recorder_group = 0;
  std::map<CommOp, CommStats> stats;
  int size() const { return int(world_ranks.size()); }
  std::string key() const {
    std::string k = name + " [";
    for (size_t i = 0; i < world_ranks.size(); ++i) k += (i ? ", " : "") + std::to_string(world_ranks[i]);
    return k + "]";
  }
};

struct CommEngine::Control {
  MPI_Comm comm = MPI_COMM_NULL;
  int incoming[2] = {0, 0};  // {kind, requester}
  MPI_Request recv = MPI_REQUEST_NULL;
  std::list<std::pair<MPI_Request, std::string>> replies;  // sends in flight and their buffers (stable)
};

namespace {

constexpr int kDumpTag = 7001, kReplyTag = 7002;
// All-reduces up to this size gather every member's whole buffer and reduce it locally: one
// latency instead of two, for (N-1) x bytes that are negligible (losses, norms, flags).
constexpr size_t kSmallAllReduceBytes = 4096;

// Whether an all-reduce takes the two-stage path (reduce-scatter, then all-gather on comm2).
bool two_stage_all_reduce(int64_t count, Elem e, int members) {
  return !(size_t(count) * elem_bytes(e) <= kSmallAllReduceBytes || count < members);
}


MPI_Datatype mpi_type(Elem e) {
  switch (e) {
    case Elem::f32: return MPI_FLOAT;
    case Elem::bf16: case Elem::f16: case Elem::u16: return MPI_UINT16_T;
    case Elem::f64: return MPI_DOUBLE;
    case Elem::i32: return MPI_INT32_T;
    case Elem::i64: return MPI_INT64_T;
    case Elem::u8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::f32: return "f32";
    case Elem::bf16: return "bf16";
    case Elem::f16: return "f16";
    case Elem::u16: return "u16";
    case Elem::f64: return "f64";
    case Elem::i32: return "i32";
    case Elem::i64: return "i64";
    case Elem::u8: return "u8";
  }
  return "?";
}

int mpi_count(int64_t n) {
  TITAN_CHECK(n >= 0 && n <= INT_MAX, "a collective of " + std::to_string(n) + " elements exceeds MPI's int counts",
              "split the buffer (this build moves at most 2^31 - 1 elements per call)");
  return int(n);
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  std::fprintf(stderr, "titan: %s failed: %s\n", what, text);
  MPI_Abort(MPI_COMM_WORLD, 3);
}

// out[i] = op over ranks r = 0..n-1 of rows[r][i], combined as a binary tree over the ranks:
// rows (0, 1), (2, 3), ... first, then pairs of pairs: ((x0 + x1) + (x2 + x3)) for 4. The same
// tree over any aligned block of ranks is the same sum, so a reduction over shard groups then
// over their replicas (HSDP), or over ranks then over micro-batches, equals one over all of them
// when the sizes are powers of two. Rows are `chunk` elements apart; bf16 accumulates in f32 and
// rounds once.
// The tree of TreeSum (tree_sum.h) over ranks: the two must stay the same tree.
template <class Acc>
void fold_in_place(Acc* acc, int n, int64_t chunk, ReduceOp op) {
  for (int stride = 1; stride < n; stride *= 2)
    for (int r = 0; r + stride < n; r += 2 * stride) {
      Acc* left = acc + int64_t(r) * chunk;
      const Acc* right = acc + int64_t(r + stride) * chunk;
      switch (op) {
        case ReduceOp::sum: for (int64_t i = 0; i < chunk; ++i) left[i] += right[i]; break;
        case ReduceOp::max: for (int64_t i = 0; i < chunk; ++i) left[i] = std::max(left[i], right[i]); break;
        case ReduceOp::min: for (int64_t i = 0; i < chunk; ++i) left[i] = std::min(left[i], right[i]); break;
      }
    }
}

// rows: the engine's own scratch, reduced in place (row 0 ends up holding the result) before it
// is copied to out (which may be row 0 itself).
template <class T>
void fold(T* rows, int n, int64_t chunk, T* out, ReduceOp op) {
  fold_in_place(rows, n, chunk, op);
  if (out != rows) std::memcpy(out, rows, size_t(chunk) * sizeof(T));
}

inline float to_float(bf16 v) { return bf16_to_f32(v); }
inline float to_float(f16 v) { return f16_to_f32(v); }
template <class Half> Half from_float(float v);
template <> inline bf16 from_float<bf16>(float v) { return f32_to_bf16(v); }
template <> inline f16 from_float<f16>(float v) { return f32_to_f16(v); }

// bf16 and f16 rows: summed in f32, rounded once (f16 overflows to infinity, which the loss
// scaler must see).
template <class Half>
void fold_half(const Half* rows, int n, int64_t chunk, Half* out, ReduceOp op) {
  std::vector<float> acc(static_cast<size_t>(n) * size_t(chunk));
  for (size_t i = 0; i < acc.size(); ++i) acc[i] = to_float(rows[i]);
  fold_in_place(acc.data(), n, chunk, op);
  for (int64_t i = 0; i < chunk; ++i) out[i] = from_float<Half>(acc[size_t(i)]);
}

void reduce_rows(Elem e, void* rows, int n, int64_t chunk, void* out, ReduceOp op) {
  switch (e) {
    case Elem::f32: fold(static_cast<float*>(rows), n, chunk, static_cast<float*>(out), op); break;
    case Elem::f64: fold(static_cast<double*>(rows), n, chunk, static_cast<double*>(out), op); break;
    case Elem::bf16: fold_half(static_cast<const bf16*>(rows), n, chunk, static_cast<bf16*>(out), op); break;
    case Elem::f16: fold_half(static_cast<const f16*>(rows), n, chunk, static_cast<f16*>(out), op); break;
    case Elem::i32: fold(static_cast<int32_t*>(rows), n, chunk, static_cast<int32_t*>(out), op); break;
    case Elem::i64: fold(static_cast<int64_t*>(rows), n, chunk, static_cast<int64_t*>(out), op); break;
    case Elem::u8: case Elem::u16:
      TITAN_FAIL(std::string("reductions of ") + elem_name(e) + " are not supported", "reduce f32, bf16, f16, f64 or integers");
  }
}

}  // namespace

size_t elem_bytes(Elem e) {
  switch (e) {
    case Elem::f32: case Elem::i32: return 4;
    case Elem::bf16: case Elem::f16: case Elem::u16: return 2;
    case Elem::f64: case Elem::i64: return 8;
    case Elem::u8: return 1;
  }
  return 1;
}

Elem elem_of(DType d) {
  switch (d) {
    case DType::f32: return Elem::f32;
    case DType::bf16: return Elem::bf16;
    case DType::f16: return Elem::f16;
    case DType::i32: return Elem::i32;
    case DType::i64: return Elem::i64;
    case DType::u8: case DType::f8e4m3: case DType::f8e5m2: case DType::e8m0: return Elem::u8;
    case DType::f4e2m1: break;
  }
  TITAN_FAIL(std::string("tensors of ") + std::string(dtype_name(d)) + " cannot be communicated", "use a byte-sized dtype");
}

const char* comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::all_reduce: return "all_reduce";
    case CommOp::reduce_scatter: return "reduce_scatter";
    case CommOp::all_gather: return "all_gather";
    case CommOp::all_gatherv: return "all_gatherv";
    case CommOp::all_to_all: return "all_to_all";
    case CommOp::all_to_allv: return "all_to_allv";
    case CommOp::broadcast: return "broadcast";
    case CommOp::send: return "send";
    case CommOp::recv: return "recv";
    case CommOp::barrier: return "barrier";
    case CommOp::split: return "split";
  }
  return "?";
}

// ---- Work ---------------------------------------------------------------------------------------

namespace {
// Tells the engine a caller blocks on a result for as long as it lives (it polls faster then).
struct BlockedCaller {
  explicit BlockedCaller(CommEngine& e) : engine(e) { engine.caller_waits(true); }
  ~BlockedCaller() { engine.caller_waits(false); }
  BlockedCaller(const BlockedCaller&) = delete;
  BlockedCaller& operator=(const BlockedCaller&) = delete;
  CommEngine& engine;
};
}  // namespace

void Work::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->done) {
    const double t0 = steady_seconds();
    CommEngine& engine = CommEngine::get();
    {
      const BlockedCaller blocked(engine);
      state_->cv.wait(lock, [&] { return state_->done; });
    }
    const double t1 = steady_seconds();
    engine.add_exposed(t1 - t0);
    trace_span("wait for communication", "wait", t0, t1);
  }
  if (!state_->error.empty()) [[unlikely]]
    TITAN_FAIL(state_->error, "the communication thread of this rank stopped after that failure and its flight "
                              "recorder was dumped; the job cannot go on: fix what it names and rerun (`titan launch` "
                              "restarts from the last committed checkpoint)");
}

void Work::settle() const noexcept {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
}

bool Work::completed() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

// ---- the engine -----------------------------------------------------------------------------------

CommEngine& CommEngine::get() {
  static CommEngine engine;
  return engine;
}

CommEngine::~CommEngine() {
  // A process that leaves without stop() (an exception on the way out) must not hang in join.
  if (thread_.joinable()) thread_.detach();
}

void CommEngine::start(bool use_mpi) {
  std::unique_lock<std::mutex> lock(mu_);
  if (started_) return;
  started_ = true;
  mpi_ = use_mpi;
  if (!mpi_) {
    groups_.push_back(std::make_unique<CommGroup>());
    groups_.back()->name = "world";
    groups_.back()->world_ranks = {0};
    groups_.back()->recorder_group = recorder_.add_group("world", {0});
    world_ = std::make_unique<ProcessGroup>(0, "world", 0, std::vector<int>{0});
    return;
  }
  thread_ = std::thread([this] { loop(); });
  cv_.wait(lock, [&] { return ready_; });
}

void CommEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommEngine::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_ && (thread_multiple_ || std::this_thread::get_id() == comm_thread_)) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // a rank that exits abnormally makes mpirun end the job
}

ProcessGroup& CommEngine::world() {
  TITAN_CHECK(world_ != nullptr, "the communication engine is not started", "call distributed::init_runtime() first");
  return *world_;
}

void CommEngine::set_timeout(double seconds) { timeout_ = seconds; }
void CommEngine::set_init_timeout(double seconds) { init_timeout_ = seconds; }

void CommEngine::fail_next_request_for_test(const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  injected_failure_ = what;
  inject_failure_ = true;
}
fs::path CommEngine::default_trace_folder() {
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  return (ec ? fs::path("/tmp") : tmp) / "titan_comm_traces";
}

void CommEngine::set_trace_folder(const fs::path& folder) {
  std::lock_guard<std::mutex> lock(mu_);
  trace_folder_ = folder;
}
void CommEngine::set_trace_buffer(size_t entries) { recorder_.set_capacity(entries); }

std::map<std::pair<std::string, CommOp>, CommStats> CommEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::pair<std::string, CommOp>, CommStats> out;
  for (const auto& g : groups_)
    for (const auto& [op, s] : g->stats) {
      CommStats& o = out[{g->name, op}];
      o.calls += s.calls, o.bytes += s.bytes, o.cross_host_bytes += s.cross_host_bytes;
      o.busy_seconds += s.busy_seconds;
    }
  return out;
}

CommStats CommEngine::total() const {
  CommStats t;
  for (const auto& [key, s] : stats()) {
    t.calls += s.calls, t.bytes += s.bytes, t.cross_host_bytes += s.cross_host_bytes;
    t.busy_seconds += s.busy_seconds;
  }
  return t;
}

int CommEngine::hosts() const {
  std::vector<int> distinct = host_of_;
  std::sort(distinct.begin(), distinct.end());
  return std::max(1, int(std::unique(distinct.begin(), distinct.end()) - distinct.begin()));
}

void CommEngine::reset_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& g : groups_) g->stats.clear();
}

void CommEngine::init_mpi() {
  // Every call is made here but one: MPI_Abort, which a failing main thread must be able to make.
  // Each blocking call has the start-up deadline: a rank that never starts, or dies before one of
  // these, would otherwise leave the others inside it for good (the watchdog polls only requests).
  const double limit = init_timeout_.load();
  const auto expire = [this](bool dump) {
    return [this, dump](const std::string& what, double seconds) { expire_blocking(what, seconds, dump); };
  };
  int provided = 0;
  {
    const Deadline d("MPI_Init", limit, expire(false));
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  }
  thread_multiple_ = provided >= MPI_THREAD_MULTIPLE;
  comm_thread_ = std::this_thread::get_id();
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  auto g = std::make_unique<CommGroup>();
  g->name = "world";
  for (int r = 0; r < world_size_; ++r) g->world_ranks.push_back(r);
  g->rank = world_rank_;
  g->recorder_group = recorder_.add_group(g->name, g->world_ranks);
  {
    const Deadline d("MPI start-up: the hosts' MPI_Comm_split_type, MPI_Allreduce and MPI_Allgather over the world",
                     limit, expire(true));
    // Hosts: the ranks that share memory (Open MPI's node), each named by its smallest world rank.
    MPI_Comm node = MPI_COMM_NULL;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank_, MPI_INFO_NULL, &node);
    int host = world_rank_;
    MPI_Allreduce(MPI_IN_PLACE, &host, 1, MPI_INT, MPI_MIN, node);
    MPI_Comm_free(&node);
    host_of_.assign(size_t(world_size_), 0);
    MPI_Allgather(&host, 1, MPI_INT, host_of_.data(), 1, MPI_INT, MPI_COMM_WORLD);
  }
  control_ = std::make_unique<Control>();
  {
    const Deadline d("MPI start-up: MPI_Comm_dup of the world (its communicators and the control channel)", limit,
                     expire(true));
    MPI_Comm_dup(MPI_COMM_WORLD, &g->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &g->comm2);
    MPI_Comm_dup(MPI_COMM_WORLD, &control_->comm);
  }
  world_ = std::make_unique<ProcessGroup>(0, "world", world_rank_, g->world_ranks);
  groups_.push_back(std::move(g));
  MPI_Irecv(control_->incoming, 2, MPI_INT, MPI_ANY_SOURCE, kDumpTag, control_->comm, &control_->recv);
}

std::unique_ptr<ProcessGroup> CommEngine::split(const ProcessGroup& parent, int color, int key, const std::string& name) {
  if (!mpi_ || parent.size() == 1) {
    std::lock_guard<std::mutex> lock(mu_);
    auto g = std::make_unique<CommGroup>();
    g->name = name;
    g->world_ranks = {world_rank_};
    g->recorder_group = recorder_.add_group(name, g->world_ranks);
    groups_.push_back(std::move(g));
    return std::make_unique<ProcessGroup>(int(groups_.size()) - 1, name, 0, std::vector<int>{world_rank_});
  }
  // Every member's world rank, color and key, then the split itself on the communication
  // thread (it owns every MPI call): a barrier-like request carries the task.
  const std::vector<std::string> all = parent.all_gather(fmt::format("{} {}", color, key));
  std::vector<std::pair<int, int>> members;  // (key, world rank) of this color
  for (size_t i = 0; i < all.size(); ++i) {
    int c = 0, k = 0;
    std::sscanf(all[i].c_str(), "%d %d", &c, &k);
    if (c == color) members.emplace_back(k, parent.world_ranks()[i]);
  }
  std::sort(members.begin(), members.end());
  std::vector<int> ranks;
  for (const auto& m : members) ranks.push_back(m.second);
  const int my = int(std::find(ranks.begin(), ranks.end(), world_rank_) - ranks.begin());

  auto g = std::make_unique<CommGroup>();
  g->name = name;
  g->world_ranks = ranks;
  g->rank = my;
  CommGroup* child = g.get();
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g->recorder_group = recorder_.add_group(name, ranks);
    groups_.push_back(std::move(g));
    index = int(groups_.size()) - 1;
  }
  // MPI_Comm_split on the communication thread, in queue order (a collective over the parent).
  auto task = std::make_unique<Request>();
  task->op = CommOp::split;
  task->group = parent.engine_group();
  task->peer = color;
  task->tag = key;
  task->split_child = child;
  enqueue(std::move(task)).wait();
  return std::make_unique<ProcessGroup>(index, name, my, ranks);
}

Work CommEngine::enqueue(std::unique_ptr<Request> r) {
  r->work = std::make_shared<WorkState>();
  Work work(r->work);
  std::unique_lock<std::mutex> lock(mu_);
  CommGroup& g = *groups_.at(size_t(r->group));
  r->g = &g;
  const bool p2p = r->op == CommOp::send || r->op == CommOp::recv;
  const int sender = r->op == CommOp::send ? g.rank : r->peer, receiver = r->op == CommOp::send ? r->peer : g.rank;
  // A transfer's id counts its channel, as MPI matches them (in order per sender, receiver and tag).
  if (p2p) r->seq = ++g.p2p_seq[{sender, receiver, r->tag}];
  else r->seq = ++g.next_seq;
  if (r->op == CommOp::all_reduce && two_stage_all_reduce(r->in_elems, r->elem, g.size())) r->ar_index = g.next_all_reduce++;
  FlightEntry e;
  e.group = g.recorder_group;
  e.seq = r->seq;
  e.op = p2p ? fmt::format("{} {}->{}", comm_op_name(r->op), sender, receiver) : comm_op_name(r->op);
  if (p2p) e.tag = r->tag;
  e.dtype = elem_name(r->elem);
  e.in_elems = r->in_elems;
  e.out_elems = r->out_elems;
  e.enqueued = recorder_.now();
  r->record = recorder_.record(e);
  if (g.size() == 1) {
    lock.unlock();
    // One member: the result is the input.
    const size_t eb = elem_bytes(r->elem);
    if (r->out && r->in && r->out != r->in && r->op != CommOp::broadcast)
      std::memcpy(r->out, r->in, size_t(std::min(r->in_elems, r->out_elems)) * eb);
    recorder_.set_state(r->record, OpState::completed, recorder_.now());
    std::lock_guard<std::mutex> wl(r->work->mu);
    r->work->done = true;
    return work;
  }
  TITAN_CHECK(mpi_, "a collective on group " + g.name + " of " + std::to_string(g.size()) + " ranks without MPI");
  if (!failed_.empty()) [[unlikely]] {  // the thread stopped serving: this one fails at once
    const std::string error = fmt::format("{} #{} on group {} was not started: {}", e.op, r->seq, g.key(), failed_);
    lock.unlock();
    fail_work(*r, error);
    return work;
  }
  queue_.push_back(std::move(r));
  lock.unlock();
  cv_.notify_one();
  return work;
}

void CommEngine::start_request(Request& r) {
  if (inject_failure_.load(std::memory_order_relaxed)) [[unlikely]] {
    std::string what;
    {
      std::lock_guard<std::mutex> lock(mu_);
      what = injected_failure_;
      inject_failure_ = false;
    }
    throw std::runtime_error(what);
  }
  CommGroup& g = *r.g;
  r.mpi = std::make_unique<MpiHandles>();
  r.started = steady_seconds();
  r.deadline = r.started + timeout_.load();
  recorder_.set_state(r.record, OpState::started, recorder_.now());
  const MPI_Datatype t = mpi_type(r.elem);
  const size_t eb = elem_bytes(r.elem);
  const int n = g.size();
  MPI_Request h = MPI_REQUEST_NULL;
  switch (r.op) {
    case CommOp::split: {  // blocking, collective over the parent: a member that never calls it holds the others
      const Deadline d(fmt::format("MPI_Comm_split of group {} (#{}, making group {})",
                                   g.key(), r.seq, r.split_child->name),
                       init_timeout_.load(),
                       [this](const std::string& what, double seconds) { expire_blocking(what, seconds, true); });
      MPI_Comm_split(g.comm, r.peer, r.tag, &r.split_child->comm);
      MPI_Comm_dup(r.split_child->comm, &r.split_child->comm2);
      return;
    }
    case CommOp::barrier:
      check_mpi(MPI_Ibarrier(g.comm, &h), "MPI_Ibarrier");
      break;
    case CommOp::all_gather:
      check_mpi(MPI_Iallgather(r.in, mpi_count(r.in_elems), t, r.out, mpi_count(r.in_elems), t, g.comm, &h), "MPI_Iallgather");
      break;
    case CommOp::all_gatherv: {
      std::vector<int> counts(static_cast<size_t>(n)), displs(static_cast<size_t>(n));
      // Offsets are checked like counts: each fits an int only while the running total does.
      for (int64_t i = 0, off = 0; i < n; ++i)
        counts[size_t(i)] = mpi_count(r.recv_counts[size_t(i)]), displs[size_t(i)] = mpi_count(off), off += counts[size_t(i)];
      check_mpi(MPI_Iallgatherv(r.in, mpi_count(r.in_elems), t, r.out, counts.data(), displs.data(), t, g.comm, &h),
                "MPI_Iallgatherv");
      break;
    }
    case CommOp::all_to_all:
      check_mpi(MPI_Ialltoall(r.in, mpi_count(r.in_elems / n), t, r.out, mpi_count(r.in_elems / n), t, g.comm, &h), "MPI_Ialltoall");
      break;
    case CommOp::all_to_allv: {
      const size_t members = static_cast<size_t>(n);
      std::vector<int> sc(members), sd(members), rc(members), rd(members);
      for (int64_t i = 0, so = 0, ro = 0; i < n; ++i) {
        sc[size_t(i)] = mpi_count(r.send_counts[size_t(i)]), sd[size_t(i)] = mpi_count(so), so += sc[size_t(i)];
        rc[size_t(i)] = mpi_count(r.recv_counts[size_t(i)]), rd[size_t(i)] = mpi_count(ro), ro += rc[size_t(i)];
      }
      check_mpi(MPI_Ialltoallv(r.in, sc.data(), sd.data(), t, r.out, rc.data(), rd.data(), t, g.comm, &h), "MPI_Ialltoallv");
      break;
    }
    case CommOp::broadcast:
      check_mpi(MPI_Ibcast(r.out, mpi_count(r.out_elems), t, r.peer, g.comm, &h), "MPI_Ibcast");
      break;
    case CommOp::send:
      check_mpi(MPI_Isend(r.in, mpi_count(r.in_elems), t, r.peer, r.tag, g.comm, &h), "MPI_Isend");
      break;
    case CommOp::recv:
      check_mpi(MPI_Irecv(r.out, mpi_count(r.out_elems), t, r.peer, r.tag, g.comm, &h), "MPI_Irecv");
      break;
    case CommOp::reduce_scatter:
      // Every member's chunk for me, then the sum in rank order (progress()).
      r.scratch = Tensor::empty({int64_t(size_t(n) * size_t(r.out_elems) * eb)}, DType::u8);
      check_mpi(MPI_Ialltoall(r.in, mpi_count(r.out_elems), t, r.scratch.data_ptr(), mpi_count(r.out_elems), t, g.comm, &h),
                "MPI_Ialltoall");
      break;
    case CommOp::all_reduce: {
      const int64_t count = r.in_elems;
      if (!two_stage_all_reduce(count, r.elem, n)) {
        r.stage = 10;  // gather every member's buffer, reduce locally
        r.scratch = Tensor::empty({int64_t(size_t(n) * size_t(count) * eb)}, DType::u8);
        check_mpi(MPI_Iallgather(r.out, mpi_count(count), t, r.scratch.data_ptr(), mpi_count(count), t, g.comm, &h),
                  "MPI_Iallgather");
        break;
      }
      // Reduce-scatter of ceil(count / n)-element chunks (padded), then an all-gather of them.
      const int64_t chunk = (count + n - 1) / n;
      const void* src = r.out;
      if (chunk * n != count) {
        r.staging = Tensor::zeros({int64_t(size_t(chunk * n) * eb)}, DType::u8);
        std::memcpy(r.staging.data_ptr(), r.out, size_t(count) * eb);
        src = r.staging.data_ptr();
      }
      r.scratch = Tensor::empty({int64_t(size_t(n) * size_t(chunk) * eb)}, DType::u8);
      r.stage = 1;
      check_mpi(MPI_Ialltoall(src, mpi_count(chunk), t, r.scratch.data_ptr(), mpi_count(chunk), t, g.comm, &h), "MPI_Ialltoall");
      break;
    }
  }
  r.mpi->requests.push_back(h);
}

bool CommEngine::progress(Request& r) {
  CommGroup& g = *r.g;
  if (r.op == CommOp::split) return true;  // it ran in start_request
  const int n = g.size();
  const size_t eb = elem_bytes(r.elem);
  if (r.stage == 2) {  // reduced; its all-gather waits for the group's earlier all-reduces to start theirs
    if (g.all_reduce_stage2_started != r.ar_index) return false;
    const int64_t chunk = (r.in_elems + n - 1) / n;
    void* dst = r.staging.defined() ? r.staging.data_ptr() : r.out;
    MPI_Request h = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallgather(r.scratch.data_ptr(), mpi_count(chunk), mpi_type(r.elem), dst, mpi_count(chunk), mpi_type(r.elem),
                             g.comm2, &h),
              "MPI_Iallgather");
    ++g.all_reduce_stage2_started;
    r.mpi->requests = {h};
    r.stage = 3;
    return false;
  }
  int done = 0;
  check_mpi(MPI_Testall(int(r.mpi->requests.size()), r.mpi->requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
  if (!done) return false;
  switch (r.op) {
    case CommOp::reduce_scatter:
      reduce_rows(r.elem, r.scratch.data_ptr(), n, r.out_elems, r.out, r.reduce);
      return true;
    case CommOp::all_reduce:
      if (r.stage == 10) {
        reduce_rows(r.elem, r.scratch.data_ptr(), n, r.in_elems, r.out, r.reduce);
        return true;
      }
      if (r.stage == 1) {
        const int64_t chunk = (r.in_elems + n - 1) / n;
        reduce_rows(r.elem, r.scratch.data_ptr(), n, chunk, r.scratch.data_ptr(), r.reduce);  // into row 0
        r.stage = 2;
        return progress(r);
      }
      if (r.staging.defined()) std::memcpy(r.out, r.staging.data_ptr(), size_t(r.in_elems) * eb);  // stage 3
      return true;
    default:
      return true;
  }
}

void CommEngine::finish_request(Request& r) {
  CommGroup& g = *r.g;
  const int n = g.size();
  const double eb = double(elem_bytes(r.elem));
  double bytes = 0;
  switch (r.op) {
    case CommOp::all_gather: case CommOp::all_gatherv: bytes = double(r.in_elems) * eb * (n - 1); break;
    case CommOp::all_to_all: case CommOp::reduce_scatter: bytes = double(r.in_elems) * eb * (n - 1) / n; break;
    case CommOp::all_to_allv:
      for (int i = 0; i < n; ++i)
        if (i != g.rank) bytes += double(r.send_counts[size_t(i)]) * eb;
      break;
    case CommOp::all_reduce:
      if (r.stage == 10) bytes = double(r.in_elems) * eb * (n - 1);
      else bytes = 2.0 * double((r.in_elems + n - 1) / n * n) * eb * (n - 1) / n;
      break;
    case CommOp::broadcast: bytes = g.rank == r.peer ? double(r.out_elems) * eb : 0; break;
    case CommOp::send: bytes = double(r.in_elems) * eb; break;
    case CommOp::recv: case CommOp::barrier: case CommOp::split: break;
  }
  // The part that left this host.
  const auto remote = [&](int i) { return host_of(g.world_ranks[size_t(i)]) != host_of(world_rank_); };
  double crossing = 0;
  if (r.op == CommOp::send) {
    crossing = remote(r.peer) ? bytes : 0;
  } else if (r.op == CommOp::all_to_allv) {
    for (int i = 0; i < n; ++i)
      if (remote(i)) crossing += double(r.send_counts[size_t(i)]) * eb;
  } else if (n > 1) {
    int others = 0;
    for (int i = 0; i < n; ++i) others += remote(i);
    crossing = bytes * others / (n - 1);
  }
  const double end = steady_seconds();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.op != CommOp::split) {
      CommStats& s = g.stats[r.op];
      ++s.calls;
      s.bytes += int64_t(bytes + 0.5);
      s.cross_host_bytes += int64_t(crossing + 0.5);
      s.busy_seconds += end - r.started;
    }
  }
  recorder_.set_state(r.record, OpState::completed, recorder_.now());
  if (tracing())
    trace_span(fmt::format("{} {}", comm_op_name(r.op), g.name), "collective", r.started, end,
               json{{"group", g.key()}, {"seq", r.seq}, {"bytes_sent", int64_t(bytes + 0.5)},
                    {"cross_host_bytes", int64_t(crossing + 0.5)}, {"elements", std::max(r.in_elems, r.out_elems)},
                    {"dtype", elem_name(r.elem)}}.dump());
  r.keep_in = Tensor();
  r.keep_out = Tensor();
  r.scratch = Tensor();
  r.staging = Tensor();
  std::lock_guard<std::mutex> lock(r.work->mu);
  r.work->done = true;
  r.work->cv.notify_all();
}

// Progress happens only inside MPI calls, so the pause between polls bounds the latency of every
// step of a transfer; it grows while nothing moves. While a caller blocks in Work::wait its core
// is free and someone needs the result: pauses grow slowly, to 100 us. While every caller
// computes, each wake-up of this thread preempts one of them (on a VM, with a timer interrupt's
// exit): pauses double, to 1 ms. On 2 ranks x 1 thread sharing 2 cores, polling at the waiting
// pace all the time took about 10k wake-ups a second and slowed pipeline compute by about 12%.
std::chrono::microseconds CommEngine::poll_pause(int idle_polls, bool caller_waiting) {
  if (caller_waiting) return std::chrono::microseconds(std::min(5 * idle_polls, 100));
  return std::chrono::microseconds(std::min(5 << std::min(idle_polls, 8), 1000));
}

void CommEngine::caller_waits(bool starts) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiters_ += starts ? 1 : -1;
  }
  if (starts) cv_.notify_all();
}

void CommEngine::loop() {
  prctl(PR_SET_TIMERSLACK, 1000UL);  // sleeps of tens of microseconds between polls, not the default 50 us slack
  trace_name_thread("communication");
  init_mpi();
  // A higher priority than compute (nice -10), so that a wake-up runs at once rather than behind a
  // compute thread on a busy core: each hop of a pipeline waits for one. Set after MPI's start, so
  // threads it spawns keep the default. Without CAP_SYS_NICE (or RLIMIT_NICE) it fails quietly.
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), -10);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = true;
  }
  cv_.notify_all();
  int idle_polls = 0;  // polls in a row that moved nothing
  while (true) {
    std::deque<std::unique_ptr<Request>> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (queue_.empty() && active_.empty()) {
        if (stopping_) break;
        // Idle: wake for new requests, and now and then for the control channel.
        cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return !queue_.empty() || stopping_; });
      } else if (!active_.empty() && idle_polls > 2) {
        // Nothing moved lately: pause before the next poll. A new request, or a caller starting to
        // wait, ends the pause at once (a caller's wait restarts the fast polls).
        const int waiters = waiters_;
        cv_.wait_for(lock, poll_pause(idle_polls, waiters > 0),
                     [&] { return !queue_.empty() || waiters_ > waiters; });
        if (waiters_ > waiters) idle_polls = 0;
      }
      incoming.swap(queue_);
    }
    bool moved = !incoming.empty();
    // What the thread works on, for the error should it throw (named only then: nothing formatted here).
    const Request* current = nullptr;
    const char* phase = "";
    try {
      while (!incoming.empty()) {
        current = incoming.front().get(), phase = "starting";
        start_request(*incoming.front());
        active_.push_back(std::move(incoming.front()));
        incoming.pop_front();
      }
      for (size_t i = 0; i < active_.size();) {
        current = active_[i].get(), phase = "driving";
        if (progress(*active_[i])) {
          phase = "completing";
          finish_request(*active_[i]);
          active_.erase(active_.begin() + long(i));
          moved = true;
        } else {
          ++i;
        }
      }
      current = nullptr, phase = "";
      check_deadlines();
      serve_control();
    } catch (const std::exception& e) {
      fail_thread(current, phase, e.what(), incoming);  // (takes the char*: nothing allocated here)
    } catch (...) {
      fail_thread(current, phase, "an exception of unknown type", incoming);
    }
    if (!active_.empty()) idle_polls = moved ? 0 : std::min(idle_polls + 1, 50);
  }
  // Stop: cancel the control receive, finalize.
  if (control_) {
    if (control_->recv != MPI_REQUEST_NULL) {
      MPI_Cancel(&control_->recv);
      MPI_Wait(&control_->recv, MPI_STATUS_IGNORE);
    }
    for (auto& [req, buf] : control_->replies) MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  bool failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed = !failed_.empty();
  }
  // After a failure, transfers may still be in flight and other ranks may never come: leave
  // without the barrier (the launcher sees a rank end without MPI_Finalize and ends the job).
  if (failed) return;
  // Every rank reaches the end together; a rank that died or hangs before it would hold the others
  // here for good without a deadline.
  const auto expire = [this](const std::string& what, double seconds) { expire_blocking(what, seconds, true); };
  {
    const Deadline d("the barrier at the job's end (every rank finishing)", init_timeout_.load(),
                     expire);
    MPI_Request barrier = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &barrier), "MPI_Ibarrier");
    for (int done = 0; !done;) {
      check_mpi(MPI_Test(&barrier, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  const Deadline d("MPI_Finalize", init_timeout_.load(), expire);
  MPI_Finalize();
}

void CommEngine::fail_work(Request& r, std::string error) noexcept {
  std::lock_guard<std::mutex> lock(r.work->mu);
  r.work->error = std::move(error);
  r.work->done = true;
  r.work->cv.notify_all();
}

namespace {

// make(), or when building it throws (the failure being reported may be bad_alloc), `fallback`,
// or at worst a text short enough for the string's inline buffer: never throws, never empty.
template <class Make>
std::string text_or(Make make, const char* fallback) noexcept {
  try {
    return make();
  } catch (...) {
  }
  try {
    return std::string(fallback);
  } catch (...) {
  }
  std::string shortest;
  shortest = "out of memory";  // 13 characters: within the inline buffer, nothing allocated
  return shortest;
}

}  // namespace

// Runs inside the loop's catch handlers: nothing may escape it (std::terminate). Each step that
// allocates has a fallback, and every pending request fails whatever else fails.
void CommEngine::fail_thread(const Request* current, const char* phase, const char* what,
                             std::deque<std::unique_ptr<Request>>& incoming) noexcept {
  std::string cause = text_or(
      [&] {
        const std::string where = current ? fmt::format(" while {} {} #{} on group {}", phase, comm_op_name(current->op),
                                                        current->seq, current->g->key())
                                          : std::string();
        return fmt::format("the communication thread of rank {} failed{}: {}", world_rank_, where, what);
      },
      "the communication thread failed (out of memory while describing the failure)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      failed_ = cause;  // a copy: `cause` names the failure below too
    } catch (...) {
      failed_ = "out of memory";  // (fits any string's inline buffer: nothing allocated)
    }
  }
  // From here enqueue() fails each new request at once, so queue_ is this thread's alone. A waiting
  // caller takes a request's lock before mu_: requests are failed without holding mu_.
  std::fprintf(stderr, "titan: rank %d: %s\n", world_rank_, cause.c_str());
  try {
    dump_recorder("communication thread failed: " + cause);
    dumped_ = true;
  } catch (...) {
    std::fprintf(stderr, "titan: rank %d: its flight recorder could not be dumped\n", world_rank_);
  }
  const auto fail = [&](std::unique_ptr<Request>& r) {
    if (!r) return;
    fail_work(*r, text_or([&] { return fmt::format("{} #{} on group {} failed: {}", comm_op_name(r->op), r->seq,
                                                   r->g->key(), cause); },
                          cause.c_str()));
    try {
      failed_requests_.push_back(std::move(r));  // MPI may still read or write their buffers
    } catch (...) {
      (void)r.release();  // (push_back left it in r): leaked on purpose, for the same reason
    }
  };
  for (auto& r : queue_) fail(r);
  for (auto& r : active_) fail(r);
  for (auto& r : incoming) fail(r);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
  }
  active_.clear();
  incoming.clear();
}

void CommEngine::expire_blocking(const std::string& what, double seconds, bool dump) {
  const int rank = dump ? world_rank_ : launch_info().rank;  // (before MPI is up: as the launcher said)
  fs::path folder;
  {
    std::lock_guard<std::mutex> lock(mu_);
    folder = trace_folder_;
  }
  std::string message = fmt::format(
      "titan: rank {}: {} did not finish within {:g} s (comm.init_timeout_seconds): a rank of the job did not reach it "
      "(it died, hangs, or is still starting: raise comm.init_timeout_seconds if start-up is that slow)",
      rank, what, seconds);
  if (dump) {
    dump_recorder(fmt::format("deadline: {} did not finish within {:g} s", what, seconds));
    dumped_ = true;
    message += fmt::format(". Flight recorder: {} (read the dumps with `titan fr analyze {}`)", folder.string(),
                           folder.string());
  }
  std::fputs((message + "\n").c_str(), stderr);
  abort(3);
}

void CommEngine::check_deadlines() {
  const double now = steady_seconds();
  for (const auto& r : active_)
    if (now > r->deadline) fire(*r);
}

void CommEngine::dump_recorder(const std::string& reason) {
  fs::path folder;
  {
    std::lock_guard<std::mutex> lock(mu_);
    folder = trace_folder_;
  }
  std::error_code ec;
  fs::create_directories(folder, ec);
  std::ofstream(flight_dump_path(folder, world_rank_)) << recorder_.dump(world_rank_, world_size_, reason).dump(1);
}

void CommEngine::serve_control() {
  if (!control_) return;
  int flag = 0;
  MPI_Status status;
  MPI_Test(&control_->recv, &flag, &status);
  if (flag) {
    const int requester = control_->incoming[1];
    // A rank whose own watchdog fired keeps its dump (and its reason).
    if (!dumped_) dump_recorder(fmt::format("dump requested by rank {}, whose watchdog fired", requester));
    json last = json::object(), p2p = json::object();
    const std::vector<uint64_t> seqs = recorder_.last_seq();
    const std::vector<std::map<std::string, uint64_t>> channels = recorder_.last_p2p_seq();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& g : groups_) {
        last[g->key()] = seqs.at(size_t(g->recorder_group));
        if (!channels.at(size_t(g->recorder_group)).empty()) p2p[g->key()] = channels.at(size_t(g->recorder_group));
      }
    }
    control_->replies.emplace_back(MPI_REQUEST_NULL,
                                   json{{"rank", world_rank_}, {"last_seq", last}, {"last_p2p_seq", p2p}}.dump());
    auto& [req, buf] = control_->replies.back();
    MPI_Isend(buf.data(), int(buf.size()), MPI_CHAR, requester, kReplyTag, control_->comm, &req);
    MPI_Irecv(control_->incoming, 2, MPI_INT, MPI_ANY_SOURCE, kDumpTag, control_->comm, &control_->recv);
  }
  control_->replies.remove_if([](auto& kv) {
    int done = 0;
    MPI_Test(&kv.first, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

std::string CommEngine::who_missed_p2p(const Request& r, const std::map<int, json>& replies) const {
  const CommGroup& g = *r.g;
  const bool sends = r.op == CommOp::send;
  const int peer = g.world_ranks[size_t(r.peer)];
  const int sender = sends ? g.rank : r.peer, receiver = sends ? r.peer : g.rank;
  // The peer's half of the channel: the receive of this send, or the send of this receive.
  const std::string other = fmt::format("{} {}->{}", sends ? "recv" : "send", sender, receiver);
  const std::string channel = fmt::format("{} tag {}", other, r.tag);
  auto it = replies.find(peer);
  if (it == replies.end()) return fmt::format("did not answer (hung or dead): rank {}", peer);
  uint64_t reached = 0;
  if (const auto p2p = it->second.find("last_p2p_seq"); p2p != it->second.end())
    if (const auto group = p2p->find(g.key()); group != p2p->end()) reached = group->value(channel, uint64_t(0));
  if (reached < r.seq)
    return fmt::format("never arrived: rank {} (its last {} with tag {} on the group is #{})", peer, other, r.tag, reached);
  return fmt::format("rank {} posted its {} #{} with tag {} (the transfer may be stuck inside MPI)", peer, other, r.seq,
                     r.tag);
}

void CommEngine::fire(const Request& r) {
  CommGroup& g = *r.g;
  const bool p2p = r.op == CommOp::send || r.op == CommOp::recv;
  const std::string what =
      p2p ? fmt::format("{} {}->{} #{} (tag {}) on group {}", comm_op_name(r.op), r.op == CommOp::send ? g.rank : r.peer,
                        r.op == CommOp::send ? r.peer : g.rank, r.seq, r.tag, g.key())
          : fmt::format("{} #{} on group {}", comm_op_name(r.op), r.seq, g.key());
  const double timeout = r.deadline - r.started;
  const std::string reason = fmt::format("watchdog: {} did not finish within {:g} s", what, timeout);
  // Ask every other rank to dump its recorder and say how far it got on each group.
  int request[2] = {1, world_rank_};
  std::vector<MPI_Request> asks;
  for (int q = 0; q < world_size_; ++q) {
    if (q == world_rank_) continue;
    asks.emplace_back();
    MPI_Isend(request, 2, MPI_INT, q, kDumpTag, control_->comm, &asks.back());
  }
  dump_recorder(reason);
  dumped_ = true;
  std::map<int, json> replies;      // world rank -> its reply
  std::map<int, uint64_t> reached;  // world rank -> its last sequence id on g
  const double grace_end = steady_seconds() + std::min(10.0, std::max(2.0, timeout));
  while (int(replies.size()) < world_size_ - 1 && steady_seconds() < grace_end) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, control_->comm, &flag, &st);
    if (flag) {
      int len = 0;
      MPI_Get_count(&st, MPI_CHAR, &len);
      std::string buf(size_t(len), '\0');
      MPI_Recv(buf.data(), len, MPI_CHAR, st.MPI_SOURCE, kReplyTag, control_->comm, MPI_STATUS_IGNORE);
      const json j = json::parse(buf, nullptr, false);
      if (!j.is_discarded()) {
        reached[st.MPI_SOURCE] = j["last_seq"].value(g.key(), uint64_t(0));
        replies[st.MPI_SOURCE] = j;
      }
    } else {
      serve_control();  // another rank's watchdog may be asking us at the same time
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::vector<std::string> never, silent;
  for (int q : g.world_ranks) {
    if (q == world_rank_ || p2p) continue;
    auto it = reached.find(q);
    if (it == reached.end()) silent.push_back(std::to_string(q));
    else if (it->second < r.seq) never.push_back(fmt::format("rank {} (its last on the group is #{})", q, it->second));
  }
  std::string who;
  if (!never.empty()) {
    who = "never arrived: ";
    for (size_t i = 0; i < never.size(); ++i) who += (i ? ", " : "") + never[i];
  }
  if (!silent.empty()) {
    if (!who.empty()) who += "; ";
    who += "did not answer (hung or dead): rank";
    who += silent.size() > 1 ? "s " : " ";
    for (size_t i = 0; i < silent.size(); ++i) who += (i ? ", " : "") + silent[i];
  }
  if (p2p) who = who_missed_p2p(r, replies);
  if (who.empty()) who = "every member reached it (a member may be stuck inside it)";
  fs::path folder;
  {
    std::lock_guard<std::mutex> lock(mu_);
    folder = trace_folder_;
  }
  const std::string message = fmt::format(
      "titan: rank {}: {} did not finish within {:g} s; {}. Flight recorders: {} (read them with `titan fr analyze {}`)\n",
      world_rank_, what, timeout, who, folder.string(), folder.string());
  std::fputs(message.c_str(), stderr);
  std::ofstream(folder / fmt::format("watchdog_rank{}.txt", world_rank_)) << message;
  abort(3);
}

}  // namespace titan::distributed
