#include "titan/train/stop_request.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace titan::train {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_installed_for_good{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler stores into it");

// The first request is recorded; a Ctrl-C while one is pending (the run did not honour it yet: it
// is still starting, or saves its checkpoint) ends the process as Ctrl-C does by default. A repeated
// SIGUSR1 (a batch system's warning) is only recorded. Async-signal-safe calls only.
extern "C" void on_stop_signal(int sig) {
  if (g_stop.exchange(true) && sig == SIGINT) {
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, nullptr);
    raise(SIGINT);  // delivered as the handler returns (blocked until then): the process ends by it
    return;
  }
  if (sig == SIGINT) {
    const int saved = errno;
    static constexpr char kNote[] = "titan: stop requested (Ctrl-C again to quit at once)\n";
    [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kNote, sizeof kNote - 1);
    errno = saved;
  }
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR1);
  return set;
}

void install(struct sigaction* previous_int, struct sigaction* previous_usr1) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a system call the signal interrupts resumes
  sigaction(SIGINT, &sa, previous_int);
  sigaction(SIGUSR1, &sa, previous_usr1);
}

}  // namespace

void hold_stop_signals() {
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void install_stop_handlers() {
  if (!g_installed_for_good.exchange(true)) install(nullptr, nullptr);
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

bool stop_requested() { return g_stop.load(); }
void clear_stop_request() { g_stop.store(false); }

StopScope::StopScope() {
  if (g_installed_for_good.load()) return;
  install(&previous_int_, &previous_usr1_);
  installed_ = true;
}

StopScope::~StopScope() {
  if (!installed_) return;
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGUSR1, &previous_usr1_, nullptr);
}

}  // namespace titan::train
