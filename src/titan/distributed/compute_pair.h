// Two pieces of work on one rank that take turns, so that one's communication hides under the
// other's compute: DualPipeV's F&B pairs (a forward of one micro-batch and a backward of another),
// whose expert-parallel all-to-alls would otherwise leave the rank idle (TorchTitan's
// pipeline_parallel_expert_parallel_overlap; reference/distributed.md section 6, "F&B").
//
// The two run on two threads, but never at once: one holds the turn. The holder computes until it
// has issued a collective and is about to wait for it (handoff(), which the expert exchange calls
// between issuing an all-to-all and waiting for it); it then passes the turn and waits until it
// gets it back, by which time its collective has usually arrived. A piece that finishes passes the
// turn for good, and the other runs to its end. So a rank's collectives are issued in an order fixed
// by the program alone (each piece's order, interleaved at its handoffs), the same on every member
// of a group running the same pair, as MPI needs; and the two pieces never touch the model, the
// autograd state or the allocator at once (the turn's mutex orders everything they do). With no
// handoff in the first piece, the pair is the two run one after the other.
//
// What this costs: the pair's thread has its own OpenMP team once it runs a parallel region, on
// the same cores as the rank's (only one team computes at a time; with OMP_WAIT_POLICY=PASSIVE the
// idle one sleeps at once, otherwise it spins for libgomp's spin count first). Profiler scopes
// around an exchange (ep.dispatch, ...) include the other piece's turn.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace titan::distributed {

class ComputePair {
 public:
  ComputePair();  // starts the second thread, which waits for work
  ~ComputePair();
  ComputePair(const ComputePair&) = delete;
  ComputePair& operator=(const ComputePair&) = delete;

  // Runs first on this thread and second on the pair's thread, first holding the turn at the
  // start; returns when both finished, rethrowing first's exception if it threw, else second's.
  void run(const std::function<void()>& first, const std::function<void()>& second);

  // Of the last run: how many times the turn passed at a handoff, and the seconds each piece
  // held the turn (the two sum to the run's wall time, less the hand-overs themselves).
  int handoffs() const { return handoffs_; }
  double held_seconds(int piece) const { return held_[piece]; }

 private:
  friend void handoff();
  void pass_turn(int from, bool finished);  // with mu_ held
  void worker();
  void run_piece(int piece, const std::function<void()>& work);

  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void()>* second_ = nullptr;  // the work waiting for the pair's thread
  bool stopping_ = false;
  int turn_ = 0;
  bool finished_[2] = {false, false};
  std::exception_ptr error_[2];
  int handoffs_ = 0;
  double held_[2] = {0, 0};
  double held_since_[2] = {0, 0};
  std::thread thread_;  // last: it starts once everything it uses exists
};

// Called by a thread that has issued communication and is about to wait for it: inside a
// ComputePair whose other piece has not finished, passes it the turn and returns once it is
// back; anywhere else, returns at once.
void handoff();

}  // namespace titan::distributed
