#include "titan/cli/launch_cli.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/cli/cpu_binding.h"
#include "titan/cli/train_cli.h"
#include "titan/core/error.h"
#include "titan/train/config.h"

namespace titan::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kUsage =
    "usage: titan launch -np N [--max-restarts K] -- train --config FILE.toml [--section.key=value ...]\n\n"
    "Runs `mpirun -np N titan train ...` and restarts it from the last committed checkpoint when a\n"
    "rank dies (a signal, an error, the watchdog's abort on a hang), at most K times (default 3).\n"
    "checkpoint.enable must be true. The environment variable TITAN_MPIRUN names another mpirun.\n"
    "Each restart is logged with its cause, the steps lost and the seconds until training runs\n"
    "again, here and in <job.dump_folder>/restarts.jsonl. checkpoint.load_step sets where the first\n"
    "attempt starts; a restart goes on from the newest checkpoint the job has committed since.\n\n"
    "SIGUSR1 (a batch system's warning before its time limit), Ctrl-C or SIGTERM asks the job to save a\n"
    "checkpoint and stop; it then exits 0, and the same command resumes the run. A second Ctrl-C or\n"
    "SIGTERM ends the job at once. The job runs in its own process group: Ctrl-C reaches it only this way.\n";

// The first stop request (SIGUSR1, SIGINT or SIGTERM) asks the job to save and stop; a later SIGINT
// or SIGTERM ends it at once (a later SIGUSR1 asks again for what is under way).
volatile std::sig_atomic_t g_signal = 0;  // the first request's signal
volatile std::sig_atomic_t g_end = 0;     // a second SIGINT / SIGTERM
extern "C" void on_signal(int sig) {
  if (g_signal == 0) g_signal = sig;
  else if (sig != SIGUSR1) g_end = 1;
}

// Whether process `pid` has a handler for `sig` (/proc/PID/status, SigCgt): mpirun installs its
// SIGUSR1 forwarding some time after it starts, and until then the signal would kill it.
bool catches(pid_t pid, int sig) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  return true;  // cannot tell: send it
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The run's progress.json (rank 0 writes it after each step: the step, the step its process
// resumed from), or an empty object before the first step.
json progress(const fs::path& run) {
  std::ifstream f(run / "progress.json");
  if (!f) return json::object();
  try {
    return json::parse(f);
  } catch (const json::exception&) {
    return json::object();
  }
}
int64_t progress_step(const fs::path& run) { return progress(run).value("step", int64_t(0)); }

// Whether the watchdog wrote flight-recorder dumps into `dir` since `since`: dumps keep their
// names (rank<r>.json) from one failure to the next, so their times tell, not their number.
bool dumps_since(const fs::path& dir, fs::file_time_type since) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code time_ec;
    if (it->is_regular_file(time_ec) && it->last_write_time(time_ec) >= since && !time_ec) return true;
  }
  return false;
}

// An attempt's mpirun that outlives the watchdog's dumps by `after` seconds: the ranks abort
// within the watchdog's grace period (<= 10 s), so such an mpirun waits for a host it cannot reach
// (Open MPI 4.1 waits for that host's daemon forever) and is ended so that the job can restart.
struct StuckJob {
  fs::path traces;
  fs::file_time_type started = fs::file_time_type::clock::now();
  double after = 20, seen = 0;
  bool stuck = false;
  bool operator()() {
    const double now = unix_seconds();
    if (seen == 0 && dumps_since(traces, started)) seen = now;
    if (!stuck && seen > 0 && now - seen > after) {
      std::printf("[launch] mpirun is still running %.0f s after the watchdog's flight-recorder dumps (a host it "
                  "cannot reach?); ending it\n", after);
      std::fflush(stdout);
      stuck = true;
    }
    return stuck;
  }
};

// `root` and every process below it (/proc: parents), children after their parents. Open MPI puts
// each rank it starts in a process group of its own, so the job's group alone is mpirun.
std::vector<pid_t> process_tree(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(it->path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const size_t close = stat.rfind(')');
    char state = 0;
    long ppid = 0;
    if (close != std::string::npos && std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) == 2)
      parent_of.emplace_back(pid_t(std::stol(name)), pid_t(ppid));
  }
  std::vector<pid_t> tree = {root};
  for (size_t i = 0; i < tree.size(); ++i)
    for (const auto& [pid, ppid] : parent_of)
      if (ppid == tree[i]) tree.push_back(pid);
  return tree;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "mpirun killed by signal " + std::to_string(WTERMSIG(status));
  return "mpirun exited with status " + std::to_string(WEXITSTATUS(status)) + " (a rank died or failed)";
}

// Runs mpirun in a process group of its own (so that the terminal's Ctrl-C reaches only this
// supervisor, which asks for a save and stop; Open MPI would abort the job on it); returns its wait
// status. While it runs, `on_poll` is called every 50 ms; when it returns true, the job is ended
// (SIGTERM to its group, which ends its ranks; 5 s later SIGKILL to its group and every process
// below mpirun) and *ended_it is set.
template <class Poll>
int run_job(const std::vector<std::string>& argv, int attempt, Poll on_poll, bool* ended_it) {
  const pid_t supervisor = ::getpid();
  // Closed by the child's exec: until then the child is a copy of this process, whose SIGUSR1
  // handler a forwarded request would reach instead of mpirun's.
  int exec_pipe[2];
  TITAN_CHECK(::pipe2(exec_pipe, O_CLOEXEC) == 0, "titan launch: cannot create a pipe", "check the open-file limit");
  const std::vector<int> cpus = launcher_cpus(std::getenv("OMP_PROC_BIND") != nullptr);
  const pid_t child = ::fork();
  TITAN_CHECK(child >= 0, "titan launch: cannot fork", "check the process limits");
  if (child == 0) {
    ::close(exec_pipe[0]);
    hand_cpus_to_child(cpus);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);            // a supervisor killed outright takes its job along...
    if (::getppid() != supervisor) std::_Exit(1);  // ... also one killed before that line
    // Training reads no input; a job outside the terminal's foreground group that read it would stop.
    if (const int null = ::open("/dev/null", O_RDONLY); null >= 0) ::dup2(null, STDIN_FILENO);
    ::setenv("TITAN_RESTART", std::to_string(attempt).c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "titan launch: cannot run %s\n", args[0]);
    std::_Exit(127);
  }
  ::setpgid(child, child);  // (both sides set it: whichever runs first)
  ::close(exec_pipe[1]);
  ::fcntl(exec_pipe[0], F_SETFL, O_NONBLOCK);
  bool execed = false;
  const double started = unix_seconds();
  int status = 0;
  bool forwarded = false;
  double ending_since = 0;
  const auto end_job = [&] {  // the whole group: mpirun and the ranks it started here
    if (ending_since == 0) ending_since = unix_seconds(), ::kill(-child, SIGTERM);
  };
  while (true) {
    const pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) {
      // ECHILD: the job is no longer this process's child to wait for (a parent that ignores
      // SIGCHLD would make it so; launch_main restores the default). Nothing left to supervise.
      const int e = errno;
      end_job();
      ::close(exec_pipe[0]);
      TITAN_FAIL("titan launch: waitpid on mpirun (pid " + std::to_string(child) + ") failed: " + std::strerror(e) +
                     "; its exit status is lost, so the job's end cannot be told from a failure",
                 "the job was ended; see its output and <job.dump_folder>/progress.json for how far it got, and "
                 "rerun the same command to resume from its last checkpoint");
    }
    if (!execed) {
      char c = 0;
      execed = ::read(exec_pipe[0], &c, 1) == 0;  // end of file: the child ran exec (or ended)
    }
    // The first request asks the ranks to save and stop: SIGUSR1 to mpirun, which passes it on to
    // every rank, once it listens for it (within 10 s of its start, else it is sent anyway).
    if (g_signal && !forwarded && execed && (catches(child, SIGUSR1) || unix_seconds() - started > 10)) {
      forwarded = true;
      ::kill(child, SIGUSR1);
    }
    if (g_end) end_job();  // a second Ctrl-C: at once
    if (on_poll() && ending_since == 0) {
      *ended_it = true;
      end_job();
    }
    if (ending_since > 0 && unix_seconds() - ending_since > 5) {
      for (const pid_t p : process_tree(child)) ::kill(p, SIGKILL);  // (mpirun first: it starts no more)
      ::kill(-child, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::close(exec_pipe[0]);
  on_poll();  // a last look: the job may have trained and ended within the last 50 ms
  return status;
}

}  // namespace

int launch_main(int argc, char** argv) {
  int np = 0, max_restarts = 3, sep = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      sep = i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    TITAN_CHECK(i + 1 < argc, "titan launch: " + a + " needs a value", kUsage);
    if (a == "-np" || a == "-n" || a == "--np") np = std::atoi(argv[++i]);
    else if (a == "--max-restarts") max_restarts = std::atoi(argv[++i]);
    else TITAN_FAIL("titan launch: unknown option " + a, kUsage);
  }
  TITAN_CHECK(np >= 1, "titan launch needs -np N (the number of ranks)", kUsage);
  TITAN_CHECK(max_restarts >= 0, "titan launch: --max-restarts must be >= 0", kUsage);
  TITAN_CHECK(sep > 0 && sep + 1 < argc && std::string(argv[sep + 1]) == "train",
              "titan launch runs `titan train`: put `-- train --config FILE.toml ...` after its own options", kUsage);
  const TrainArgs t = parse_train_args(argc - sep - 1, argv + sep + 1);
  const train::JobConfig config = train::load_config(t.config_path, t.overrides);
  TITAN_CHECK(config.checkpoint.enable,
              t.config_path + ": checkpoint.enable = false, so a restart would start the run over",
              "set checkpoint.enable = true (and a checkpoint.interval: the most steps a failure can cost)");
  const fs::path run = config.job.dump_folder;
  const fs::path traces = run / config.comm.save_traces_folder;
  fs::create_directories(run);

  const char* mpirun = std::getenv("TITAN_MPIRUN");
  std::vector<std::string> cmd = {mpirun ? mpirun : "mpirun", "--bind-to", "none", "-np", std::to_string(np),
                                  fs::read_symlink("/proc/self/exe").string()};
  for (int i = sep + 1; i < argc; ++i) cmd.emplace_back(argv[i]);
  if (::getuid() == 0) {  // what Open MPI needs as root (containers, CI)
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  ::setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 0);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGUSR1, on_signal);
  std::signal(SIGCHLD, SIG_DFL);  // inherited as ignored, mpirun's exit status would be lost

  std::ofstream journal(run / "restarts.jsonl", std::ios::app);
  json pending;            // the restart under way, written once training runs again
  int64_t last_known = 0;  // the last step any attempt finished
  int64_t committed = -1;  // the newest full checkpoint an attempt committed (progress.json)
  const std::vector<std::string> first_cmd = cmd;
  for (int attempt = 0;; ++attempt) {
    StuckJob stuck;  // from now: this attempt's dumps
    stuck.traces = traces;
    bool ended_stuck = false;
    fs::remove(run / "progress.json");  // rank 0 writes it again after each step it finishes
    // A restart under way is recorded once its job has finished a step.
    const auto record_recovery = [&] {
      const json now_at = progress(run);
      committed = std::max(committed, now_at.value("checkpoint", int64_t(-1)));
      if (pending.is_null() || !now_at.contains("step")) return;
      const double now = unix_seconds();
      const int64_t from = now_at.value("resumed_from", int64_t(0));
      pending["resumed_step"] = from;
      pending["steps_lost"] = std::max<int64_t>(0, pending["last_step"].get<int64_t>() - from);
      pending["training_again_at"] = now;
      pending["seconds_to_recover"] = now - pending["failed_at"].get<double>();
      journal << pending.dump() << std::endl;
      std::printf("[launch] restart %d: resumed from step %lld (%lld steps lost), training again %.1f s after the failure\n",
                  attempt, static_cast<long long>(from), static_cast<long long>(pending["steps_lost"].get<int64_t>()),
                  pending["seconds_to_recover"].get<double>());
      std::fflush(stdout);
      pending = json();
    };
    const int status = run_job(cmd, attempt, [&] {
      record_recovery();
      return stuck();
    }, &ended_stuck);
    if (!pending.is_null()) journal << pending.dump() << std::endl;  // ended (or failed) before a step
    pending = json();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
      std::printf("[launch] %s could not be run (exit status 127); not restarting\n", cmd[0].c_str());
      return 127;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      if (g_signal) std::printf("[launch] the job stopped on request, with a checkpoint: the same command resumes it\n");
      else std::printf("[launch] the job finished after %d restart%s\n", attempt, attempt == 1 ? "" : "s");
      return 0;
    }
    if (g_signal) {
      std::printf("[launch] stopped by signal %d; not restarting\n", int(g_signal));
      return 128 + int(g_signal);
    }
    const double failed_at = unix_seconds();
    std::string cause = ended_stuck ? std::string("mpirun ended by titan launch after the ranks' watchdog fired")
                                    : describe_exit(status);
    if (dumps_since(traces, stuck.started))
      cause += "; the watchdog found a stalled collective (flight-recorder dumps in " + traces.string() +
               ", read them with `titan fr analyze`)";
    // The last step finished before the failure (a job that failed again before its first step
    // keeps the one before).
    const int64_t last = progress_step(run) > 0 ? progress_step(run) : last_known;
    last_known = last;
    committed = std::max(committed, progress(run).value("checkpoint", int64_t(-1)));
    // checkpoint.load_step pins where the first attempt starts, not every restart: a restart goes
    // on from the newest full checkpoint no later than the newest this launch committed (passing
    // over a damaged one; the pinned one again while there is none). Without load_step, the
    // trainer resumes from the newest committed checkpoint itself.
    cmd = first_cmd;
    if (config.checkpoint.load_step >= 0 && committed >= 0)
      cmd.push_back("--checkpoint.load_at_most=" + std::to_string(std::max(committed, config.checkpoint.load_step)));
    if (attempt == max_restarts) {
      std::printf("[launch] %s after step %lld; %d restarts used up, giving up\n", cause.c_str(),
                  static_cast<long long>(last), max_restarts);
      return 1;
    }
    std::printf("[launch] %s after step %lld; restart %d of %d from the last committed checkpoint\n", cause.c_str(),
                static_cast<long long>(last), attempt + 1, max_restarts);
    std::fflush(stdout);
    pending = {{"restart", attempt + 1}, {"cause", cause}, {"last_step", last}, {"failed_at", failed_at}};
  }
}

}  // namespace titan::cli
