#include "titan/checkpoint/async_save.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "titan/core/profiler.h"
#include "titan/core/trace.h"

namespace titan::checkpoint {

namespace fs = std::filesystem;

namespace {

fs::path pieces_file(const fs::path& tmp, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "pieces-%05d.json", rank);
  return tmp / name;
}


int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

AsyncSaver::~AsyncSaver() {
  abandon_at_ = now_ns() + int64_t(30e9);
  if (writer_.joinable()) writer_.join();
}

void AsyncSaver::start(const fs::path& root, const SaveRequest& request, std::optional<fs::path>* previous) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<fs::path> last = finish();
  if (previous) *previous = last;
  ProfileScope span("checkpoint staging");
  // Stage: the pieces the forward may change (buffers) are copied now, into buffers kept while
  // the pieces keep their shapes; the weights and optimizer state the writer reads in place (the
  // optimizer step waits for it: wait_staged), and an owned piece (a private copy) is written as it is.
  const auto needs_buffer = [&](size_t i) {
    const ShardedTensor& st = request.tensors[i];
    return st.local.defined() && !st.owned && !st.until_step;
  };
  bool same = buffers_.size() == request.tensors.size();
  for (size_t i = 0; same && i < buffers_.size(); ++i)
    same = needs_buffer(i) ? buffers_[i].defined() && buffers_[i].shape() == request.tensors[i].local.shape() &&
                                 buffers_[i].dtype() == request.tensors[i].local.dtype()
                           : !buffers_[i].defined();
  if (!same) {
    buffers_.clear();
    for (size_t i = 0; i < request.tensors.size(); ++i) {
      const Tensor& t = request.tensors[i].local;
      buffers_.push_back(needs_buffer(i) ? Tensor::empty(t.shape(), t.dtype(), MemCategory::temporaries) : Tensor());
    }
  }
  staged_ = request;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    if (!needs_buffer(i)) continue;
    buffers_[i].copy_(request.tensors[i].local);
    staged_.tensors[i].local = buffers_[i];
  }
  root_ = root;
  const fs::path tmp = staging_folder(root, request.step);
  if (group_.rank() == 0) make_staging_folder(tmp);
  group_.barrier().wait();
  written_ = false;
  failure_ = nullptr;
  in_flight_ = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_read_ = false;
  }
  writer_ = std::thread([this, tmp] {
    if (tracing()) trace_name_thread("checkpoint writer");  // a track only in traces it can appear in
    try {
      ProfileScope write_span("checkpoint write");
      write(tmp);
    } catch (const Error&) {
      failure_ = std::current_exception();
    } catch (const std::exception& e) {  // a filesystem_error, bad_alloc, JSON's: rethrown as what it is, named
      failure_ = std::make_exception_ptr(Error("checkpoint step " + std::to_string(staged_.step) + ": writing " +
                                                   tmp.string() + " failed: " + e.what(),
                                               "check free disk space and memory; the previous checkpoint is intact",
                                               __FILE__, __LINE__));
    } catch (...) {
      failure_ = std::current_exception();
    }
    mark_state_read();  // (after a failure too: nothing reads the state any more)
    written_ = true;
  });
  staging_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The writer thread: this rank's file and description; on rank 0 then the commit.
void AsyncSaver::write(const fs::path& tmp) {
  const int rank = group_.rank(), size = group_.size();
  const std::string pieces = write_shard(tmp, staged_, rank, staging_bytes_, [this] { mark_state_read(); });
  const fs::path mine = pieces_file(tmp, rank);
  {
    std::ofstream f(mine.string() + ".part");
    f << pieces;
    f.close();  // a write that fails while flushing shows only here
    TITAN_CHECK(!f.fail(), "cannot write " + mine.string(), "check free disk space and permissions");
  }
  fs::rename(mine.string() + ".part", mine);
  if (rank != 0) return;
  std::vector<std::string> all(static_cast<size_t>(size));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_);
  for (int r = 0; r < size; ++r) {
    const fs::path theirs = pieces_file(tmp, r);
    while (!fs::exists(theirs)) {
      if (now_ns() > abandon_at_) return;
      TITAN_CHECK(std::chrono::steady_clock::now() < deadline,
                  "checkpoint step " + std::to_string(staged_.step) + ": rank " + std::to_string(r) +
                      " did not write its file within " + std::to_string(int(timeout_)) + " s",
                  "check that rank's output for an error, and free disk space under " + root_.string());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream f(theirs);
    std::stringstream text;
    text << f.rdbuf();
    all[size_t(r)] = text.str();
  }
  for (int r = 0; r < size; ++r) fs::remove(pieces_file(tmp, r));  // metadata.json holds them all
  commit_checkpoint(root_, staged_, all, size);
}

void AsyncSaver::mark_state_read() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_read_ = true;
  }
  staged_cv_.notify_all();
}

void AsyncSaver::wait_staged() {
  if (!in_flight_) return;
  const auto t0 = std::chrono::steady_clock::now();
  {
    ProfileScope span("checkpoint wait for staging");
    std::unique_lock<std::mutex> lock(mu_);
    staged_cv_.wait(lock, [this] { return state_read_; });
  }
  waited_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

fs::path AsyncSaver::done() {
  writer_.join();
  in_flight_ = false;
  for (ShardedTensor& st : staged_.tensors)
    if (st.owned || st.until_step) st.local = Tensor();  // written: the private copies go, the live state is let be
  staged_.streams.clear();
  if (failure_) std::rethrow_exception(failure_);
  return step_folder(root_, staged_.step);
}

std::optional<fs::path> AsyncSaver::poll() {
  if (!in_flight_ || !written_) return std::nullopt;
  return done();
}

std::optional<fs::path> AsyncSaver::finish() {
  if (!in_flight_) return std::nullopt;
  return done();
}

}  // namespace titan::checkpoint
