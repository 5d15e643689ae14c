// A request to save a checkpoint and stop: Ctrl-C (SIGINT) or SIGUSR1, which `titan launch`
// forwards to its job and a batch system can be told to send before its time limit. Not SIGTERM:
// mpirun sends it to the survivors when a rank dies, and they should end at once.
//
// `titan train` holds the two signals from its first instruction (hold_stop_signals: the mask
// survives the re-exec that binds its threads, and a signal that arrives meanwhile stays pending)
// and installs the handlers before MPI starts or the model is built (install_stop_handlers), so
// that a request during start-up is recorded, not fatal; the trainer honours it before its first
// step. A Trainer used on its own (tests) installs them for the length of its run (StopScope).
// A second Ctrl-C while the first is pending (until the run stopped on it: a long or hung
// start-up, a slow save) restores the default action and ends the process by SIGINT, as an
// unhandled Ctrl-C would.
#pragma once

#include <csignal>

namespace titan::train {

// Blocks SIGINT and SIGUSR1 in the calling thread (signals sent meanwhile stay pending).
void hold_stop_signals();
// Installs the handlers for good (idempotent) and unblocks the two signals: one held pending is
// delivered now and recorded.
void install_stop_handlers();
// Whether a stop was requested since the last clear_stop_request().
bool stop_requested();
void clear_stop_request();

// Installs the handlers for its lifetime unless install_stop_handlers() did for good; restores the
// previous ones when it installed them.
class StopScope {
 public:
  StopScope();
  ~StopScope();
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

 private:
  bool installed_ = false;
  struct sigaction previous_int_ {}, previous_usr1_ {};
};

}  // namespace titan::train
