#include "titan/distributed/compute_pair.h"

#include "titan/core/clock.h"

namespace titan::distributed {

namespace {
// The pair and piece this thread runs, while it runs one.
thread_local ComputePair* t_pair = nullptr;
thread_local int t_piece = 0;
}  // namespace

ComputePair::ComputePair() : thread_([this] { worker(); }) {}

ComputePair::~ComputePair() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ComputePair::pass_turn(int from, bool finished) {
  const double t = steady_seconds();
  held_[from] += t - held_since_[from];
  if (finished) finished_[from] = true;
  const int other = 1 - from;
  if (!finished_[other]) {
    turn_ = other;
    held_since_[other] = t;
  }
  cv_.notify_all();
}

void ComputePair::run_piece(int piece, const std::function<void()>& work) {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return turn_ == piece; });
    held_since_[piece] = steady_seconds();
  }
  t_pair = this, t_piece = piece;
  try {
    work();
  } catch (...) {
    error_[piece] = std::current_exception();
  }
  t_pair = nullptr;
  std::lock_guard lock(mu_);
  pass_turn(piece, true);
}

void ComputePair::worker() {
  for (;;) {
    const std::function<void()>* work = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || second_ != nullptr; });
      if (stopping_) return;
      work = second_;
      second_ = nullptr;
    }
    run_piece(1, *work);
  }
}

void ComputePair::run(const std::function<void()>& first, const std::function<void()>& second) {
  {
    std::lock_guard lock(mu_);
    turn_ = 0;
    finished_[0] = finished_[1] = false;
    error_[0] = error_[1] = nullptr;
    handoffs_ = 0;
    held_[0] = held_[1] = 0;
    second_ = &second;
  }
  cv_.notify_all();
  run_piece(0, first);
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return finished_[1]; });
  }
  for (const std::exception_ptr& e : error_)
    if (e) std::rethrow_exception(e);
}

void handoff() {
  ComputePair* pair = t_pair;
  if (pair == nullptr) return;
  const int me = t_piece;
  std::unique_lock lock(pair->mu_);
  if (pair->finished_[1 - me]) return;
  ++pair->handoffs_;
  pair->pass_turn(me, false);
  pair->cv_.wait(lock, [&] { return pair->turn_ == me; });
}

}  // namespace titan::distributed
