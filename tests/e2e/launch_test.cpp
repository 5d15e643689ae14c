// `titan launch`: what it refuses before starting anything; a stop request (SIGUSR1 from a batch
// system to the job's process group, Ctrl-C from the terminal) saves a checkpoint, exits 0 and the
// same command resumes; a `titan train` rank asked to stop during its start-up stops cleanly; a
// supervisor started with SIGCHLD ignored still sees its job end; one killed takes its job along;
// a second Ctrl-C ends every process of the job, and a `titan train` run directly. (Restarts
// themselves run in the chaos suite, e2e.chaos: scripts/chaos.sh under ctest.)
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/byte_dataset.h"
#include "common/error_of.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/cli/launch_cli.h"

namespace fs = std::filesystem;
using titan::test::error_of;

namespace {

std::string launch_error(std::vector<std::string> args) {
  args.insert(args.begin(), "launch");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return error_of([&] { titan::cli::launch_main(int(argv.size()), argv.data()); });
}

}  // namespace

TEST(Launch, RefusesWhatCannotRestart) {
  const fs::path dir = fs::temp_directory_path() / ("titan_launch_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path config = dir / "run.toml";
  std::ofstream(config) << "[job]\ndump_folder = \"" << (dir / "run").string()
                        << "\"\n[model]\nname = \"llama3\"\n[training]\ndataset_path = \"" << dir.string() << "\"\n";
  const std::string train = "train", cfg = "--config", file = config.string();

  std::string e = launch_error({"--", train, cfg, file});
  EXPECT_NE(e.find("needs -np N"), std::string::npos) << e;
  e = launch_error({"-np", "2", cfg, file});
  EXPECT_NE(e.find("unknown option --config"), std::string::npos) << e;
  e = launch_error({"-np", "2", "--", "generate", "--checkpoint", "x"});
  EXPECT_NE(e.find("titan launch runs `titan train`"), std::string::npos) << e;
  e = launch_error({"-np", "2", "--max-restarts", "-1", "--", train, cfg, file});
  EXPECT_NE(e.find("--max-restarts must be >= 0"), std::string::npos) << e;
  // Without checkpoints a restart would start the run over: refused, naming the file and the key.
  e = launch_error({"-np", "2", "--", train, cfg, file});
  EXPECT_NE(e.find(file + ": checkpoint.enable = false"), std::string::npos) << e;
  // A malformed override is the config loader's error, before anything runs.
  e = launch_error({"-np", "2", "--", train, cfg, file, "--checkpoint.enable=true", "--fault.on_nonfinite=retry"});
  EXPECT_NE(e.find("fault.on_nonfinite"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "run" / "restarts.jsonl"));
  fs::remove_all(dir);
}

namespace {

// A process in a process group of its own (a shell's job, a batch system's job step), writing
// stdout and stderr to `log`. `env`: NAME=VALUE pairs added to its environment.
pid_t start_job(const std::vector<std::string>& args, const fs::path& log, const std::vector<std::string>& env = {},
                bool ignore_sigchld = false) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    if (ignore_sigchld) ::signal(SIGCHLD, SIG_IGN);  // inherited through exec
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

// The job's wait status, or -1 after `seconds` (its group then killed).
int wait_job(pid_t pid, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (std::chrono::steady_clock::now() < end) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return -1;
}

std::string describe(int status) {
  if (status == -1) return "still running at the deadline (killed)";
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

bool exited_ok(int status) { return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string read(const fs::path& f) {
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The last step a run reported finished (progress.json), 0 before its first.
int64_t progress_step(const fs::path& run) {
  std::ifstream f(run / "progress.json");
  if (!f) return 0;
  const auto j = nlohmann::json::parse(f, nullptr, false);
  return j.is_discarded() ? 0 : j.value("step", int64_t(0));
}

// Waits until `pred` holds, the job ended, or `seconds` passed; returns pred().
template <class Pred>
bool wait_until(pid_t job, double seconds, Pred pred) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end && !pred()) {
    siginfo_t info{};
    if (::waitid(P_PID, id_t(job), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == job) break;  // (wait_job reaps it)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// The smallest training that runs a few steps a second on one core per rank: the llama3 debug
// model on 64-token byte sequences, checkpoints at the end only (or on a stop request).
struct TinyRun {
  fs::path dir, data, run, config;
  explicit TinyRun(const std::string& name, int steps) {
    dir = fs::temp_directory_path() / ("titan_launch_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    data = titan::test::prepare_templated_dataset(dir / "data");
    run = dir / "run";
    config = dir / "run.toml";
    std::ofstream(config) << "[job]\ndump_folder = \"" << run.string() << "\"\n"
                          << "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n"
                          << "[training]\nlocal_batch_size = 2\nseq_len = 64\nsteps = " << steps
                          << "\ndataset_path = \"" << data.string() << "\"\nmixed_precision_param = \"float32\"\n"
                          << "[lr_scheduler]\nwarmup_steps = 2\n"
                          << "[checkpoint]\nenable = true\ninterval = 1000\nlast_save_model_only = false\n"
                          << "[metrics]\nlog_freq = 1\nenable_plots = false\n[validation]\nenable = false\n";
  }
  ~TinyRun() { fs::remove_all(dir); }
  std::vector<std::string> launch(int np) const {
    return {TITAN_BIN, "launch", "-np", std::to_string(np), "--", "train", "--config", config.string()};
  }
};

// The live processes (zombies aside) whose parent is `id` (or, with by_group, whose process group
// is `id`), from /proc/PID/stat.
std::vector<pid_t> processes(pid_t id, bool by_group) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read(e.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    if (state != 'Z' && state != 'X' && (by_group ? pgrp : ppid) == id) out.push_back(pid_t(std::stol(name)));
  }
  return out;
}

// Whether process `pid` runs (exited but not yet reaped counts as ended).
bool alive(pid_t pid) {
  const std::string stat = read("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

// Whether process `pid` has a handler for `sig` (SigCgt), or `sig` sent to it waits to be delivered
// (ShdPnd: what kill() sends to a process; SigPnd: what waits for its main thread), from
// /proc/PID/status.
bool status_bit(pid_t pid, const std::string& field, int sig) {
  std::istringstream status(read("/proc/" + std::to_string(pid) + "/status"));
  for (std::string line; std::getline(status, line);)
    if (line.rfind(field + ":", 0) == 0) return (std::stoull(line.substr(field.size() + 1), nullptr, 16) >> (sig - 1)) & 1;
  return false;
}
bool catches(pid_t pid, int sig) { return status_bit(pid, "SigCgt", sig); }
bool pending(pid_t pid, int sig) { return status_bit(pid, "ShdPnd", sig) || status_bit(pid, "SigPnd", sig); }

// Sends `sig` to `target` (kill's argument: -pgid for a group) and waits until process `pid` took
// it (it is no longer pending), so that a second one sent next cannot merge with it (a signal
// pending twice is delivered once). False if it still waits after 10 s.
bool send_and_wait_delivered(pid_t target, pid_t pid, int sig) {
  ::kill(target, sig);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pending(pid, sig) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return !pending(pid, sig);
}

const std::vector<std::string> kJobEnv = {"OMP_NUM_THREADS=1", "OMP_PROC_BIND=false", "OMP_WAIT_POLICY=PASSIVE",
                                          "TITAN_MPIRUN=" TITAN_MPIEXEC};

// A stop request `sig` sent to the supervisor's process group mid-run: the job saves a checkpoint
// and the supervisor exits 0 saying so; the same command then resumes from that checkpoint and
// finishes.
void stop_and_resume(const std::string& name, int sig) {
  constexpr int kSteps = 60;
  const TinyRun t(name, kSteps);
  const fs::path log = t.dir / "first.log";
  const pid_t job = start_job(t.launch(2), log, kJobEnv);
  ASSERT_TRUE(wait_until(job, 120, [&] { return progress_step(t.run) >= 2; })) << read(log);
  ::kill(-job, sig);
  const int status = wait_job(job, 120);
  const std::string out = read(log);
  ASSERT_TRUE(exited_ok(status)) << describe(status) << "\n" << out;
  EXPECT_NE(out.find("[launch] the job stopped on request, with a checkpoint"), std::string::npos) << out;
  EXPECT_EQ(out.find("[launch] restart"), std::string::npos) << out;  // a stop, not a failure
  const auto saved = titan::checkpoint::committed_checkpoints(t.run / "checkpoint");
  ASSERT_EQ(saved.size(), 1u) << out;
  const int64_t stopped_at = saved.back().first;
  EXPECT_GE(stopped_at, 2);
  EXPECT_LT(stopped_at, kSteps) << "the run ended before the stop request reached it\n" << out;

  const fs::path again = t.dir / "again.log";
  const int status2 = wait_job(start_job(t.launch(2), again, kJobEnv), 180);
  const std::string out2 = read(again);
  ASSERT_TRUE(exited_ok(status2)) << describe(status2) << "\n" << out2;
  EXPECT_NE(out2.find("[launch] the job finished after 0 restarts"), std::string::npos) << out2;
  const auto j = nlohmann::json::parse(std::ifstream(t.run / "progress.json"));
  EXPECT_EQ(j["resumed_from"].get<int64_t>(), stopped_at) << out2;
  EXPECT_EQ(j["step"].get<int64_t>(), kSteps) << out2;
}

}  // namespace

// A batch system's warning before its time limit: SIGUSR1 to the whole job step's process group.
TEST(Launch, Sigusr1ToTheProcessGroupSavesStopsAndResumes) { stop_and_resume("usr1", SIGUSR1); }

// Ctrl-C: the terminal sends SIGINT to its foreground process group, the supervisor's. Only the
// supervisor gets it (the job has a group of its own), and asks for a save and stop, rather than
// Open MPI aborting the job.
TEST(Launch, CtrlCSavesStopsAndResumes) { stop_and_resume("int", SIGINT); }

// A rank asked to stop while it starts (here: after it wrote the run's config.toml, while it builds
// the model) stops cleanly before its first step, rather than being killed by the signal. The
// window is short: a signal delayed past start-up's check (a loaded machine) stops the run at the
// end of a step instead, with a checkpoint; either way the rank was not killed.
TEST(Launch, TrainStopsCleanlyOnSigusr1DuringStartUp) {
  const TinyRun t("startup", 20);
  const fs::path log = t.dir / "train.log";
  const pid_t job = start_job({TITAN_BIN, "train", "--config", t.config.string()}, log, kJobEnv);
  ASSERT_TRUE(wait_until(job, 60, [&] { return fs::exists(t.run / "config.toml"); })) << read(log);
  ::kill(job, SIGUSR1);
  const int status = wait_job(job, 60);
  const std::string out = read(log);
  ASSERT_TRUE(exited_ok(status)) << describe(status) << "\n" << out;
  const auto saved = titan::checkpoint::committed_checkpoints(t.run / "checkpoint");
  if (out.find("stop requested during start-up, before step 1") != std::string::npos) {
    EXPECT_NE(out.find("stopped at step 0"), std::string::npos) << out;
    EXPECT_TRUE(saved.empty()) << out;
  } else {
    ASSERT_EQ(saved.size(), 1u) << "neither a stop during start-up nor one with a checkpoint\n" << out;
    const std::string step = std::to_string(saved.back().first);
    EXPECT_LT(saved.back().first, 20) << "the run ended before the stop request reached it\n" << out;
    EXPECT_NE(out.find("interrupted at step " + step + "; checkpoint saved"), std::string::npos) << out;
    EXPECT_NE(out.find("stopped at step " + step), std::string::npos) << out;
  }
}

// Ctrl-C to a `titan train` still starting (a long dataset load, a hung MPI_Init) asks it to stop;
// a second one ends it at once, by SIGINT, as when no handler is installed.
TEST(Launch, ASecondCtrlCEndsATrainDuringStartUp) {
  const TinyRun t("ctrl_c_twice", 20);
  const fs::path log = t.dir / "train.log";
  const pid_t job = start_job({TITAN_BIN, "train", "--config", t.config.string()}, log, kJobEnv);
  // Its handlers are in (it holds the signals from its first instruction and installs them before
  // anything slow: the two signals land early in start-up).
  ASSERT_TRUE(wait_until(job, 60, [&] {
    return read("/proc/" + std::to_string(job) + "/comm") == "titan\n" && catches(job, SIGINT);
  })) << read(log);
  ASSERT_TRUE(send_and_wait_delivered(job, job, SIGINT)) << read(log);
  ::kill(job, SIGINT);
  const int status = wait_job(job, 60);
  const std::string out = read(log);
  EXPECT_TRUE(status >= 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << describe(status) << "\n" << out;
  EXPECT_NE(out.find("titan: stop requested (Ctrl-C again to quit at once)"), std::string::npos) << out;
  EXPECT_EQ(out.find("stopped at step"), std::string::npos) << "it ran to its stop before the second Ctrl-C\n" << out;
}

// A supervisor started with SIGCHLD ignored (inherited from its parent through exec) would never
// see its job's exit status (waitpid: ECHILD) and spin; it restores the default and sees the end.
TEST(Launch, SeesItsJobEndWithSigchldIgnored) {
  const TinyRun t("sigchld", 1);
  const fs::path log = t.dir / "launch.log";
  const pid_t job = start_job(t.launch(1), log, {"TITAN_MPIRUN=/bin/true"}, /*ignore_sigchld=*/true);
  const int status = wait_job(job, 20);
  const std::string out = read(log);
  ASSERT_TRUE(exited_ok(status)) << describe(status) << "\n" << out;
  EXPECT_NE(out.find("[launch] the job finished after 0 restarts"), std::string::npos) << out;
}

// checkpoint.load_step pins where the first attempt starts, not every restart: a restart goes on
// from the newest checkpoint the job committed (it used to reload the pinned step each time, losing
// the work since and failing once keep_latest_k had removed it). A stand-in mpirun records each
// attempt's command; the first reports a checkpoint at step 4 in progress.json and fails.
TEST(Launch, ARestartGoesOnFromTheNewestCommitNotLoadStep) {
  const TinyRun t("load_step", 10);
  const fs::path fake = t.dir / "fake_mpirun.sh", calls = t.dir / "calls.txt";
  std::ofstream(fake) << "#!/bin/sh\necho \"$@\" >> " << calls.string() << "\n"
                      << "if [ ! -f " << (t.dir / "failed").string() << " ]; then\n"
                      << "  touch " << (t.dir / "failed").string() << "\n"
                      << "  echo '{\"step\": 5, \"resumed_from\": 2, \"checkpoint\": 4}' > " << (t.run / "progress.json").string()
                      << "\n  exit 1\nfi\nexit 0\n";
  fs::permissions(fake, fs::perms::owner_all);
  std::vector<std::string> cmd = t.launch(1);
  cmd.push_back("--checkpoint.load_step=2");
  const fs::path log = t.dir / "launch.log";
  const int status = wait_job(start_job(cmd, log, {"TITAN_MPIRUN=" + fake.string()}), 20);
  const std::string out = read(log);
  ASSERT_TRUE(exited_ok(status)) << describe(status) << "\n" << out;
  std::ifstream f(calls);
  std::string first, second;
  std::getline(f, first);
  std::getline(f, second);
  EXPECT_EQ(first.find("--checkpoint.load_at_most"), std::string::npos) << first;
  EXPECT_NE(second.find("--checkpoint.load_step=2 --checkpoint.load_at_most=4"), std::string::npos) << second;
}

// A supervisor killed outright (SIGKILL: no handler runs) still takes its job along, although the
// job has a process group of its own: mpirun gets SIGTERM (PR_SET_PDEATHSIG) and ends its ranks.
TEST(Launch, AKilledSupervisorTakesItsJobAlong) {
  const TinyRun t("kill", 5000);  // far from ending by itself
  const fs::path log = t.dir / "launch.log";
  const pid_t supervisor = start_job(t.launch(2), log, kJobEnv);
  ASSERT_TRUE(wait_until(supervisor, 120, [&] { return progress_step(t.run) >= 1; })) << read(log);
  const std::vector<pid_t> children = processes(supervisor, /*by_group=*/false);
  ASSERT_EQ(children.size(), 1u) << read(log);
  const pid_t mpirun = children[0];
  EXPECT_EQ(::getpgid(mpirun), mpirun) << "mpirun is not in a process group of its own";
  std::vector<pid_t> job = processes(mpirun, /*by_group=*/false);  // its ranks (Open MPI gives each a group)
  EXPECT_EQ(job.size(), 2u);
  job.push_back(mpirun);
  const auto running = [&] { return std::count_if(job.begin(), job.end(), alive); };
  ::kill(supervisor, SIGKILL);
  ::waitpid(supervisor, nullptr, 0);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (running() > 0 && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(running(), 0) << "the job outlived its supervisor by 30 s\n" << read(log);
  for (pid_t p : job) ::kill(p, SIGKILL);  // (whatever is left)
}

// A second Ctrl-C ends the job at once: SIGTERM to it, and 5 s later SIGKILL to mpirun and every
// process below it, although a rank has a process group of its own (as Open MPI gives each) and
// ignores SIGTERM. The job here is a stand-in mpirun that ignores SIGTERM too.
TEST(Launch, ASecondCtrlCEndsTheWholeJob) {
  const TinyRun t("end", 1);
  const fs::path fake = t.dir / "mpirun.sh", rank_pid = t.dir / "rank.pid";
  std::ofstream(fake) << "#!/bin/sh\ntrap '' TERM\nsetsid sleep 1000 &\necho $! > " << rank_pid.string()
                      << "\nwhile true; do sleep 1; done\n";
  fs::permissions(fake, fs::perms::owner_all);
  const fs::path log = t.dir / "launch.log";
  const pid_t supervisor = start_job(t.launch(2), log, {"TITAN_MPIRUN=" + fake.string()});
  ASSERT_TRUE(wait_until(supervisor, 20, [&] { return fs::exists(rank_pid) && fs::file_size(rank_pid) > 0; }))
      << read(log);
  const pid_t rank = pid_t(std::stol(read(rank_pid)));
  // The second only once the first was delivered: two pending at once would be one.
  ASSERT_TRUE(send_and_wait_delivered(-supervisor, supervisor, SIGINT)) << read(log);
  ::kill(-supervisor, SIGINT);
  const int status = wait_job(supervisor, 20);
  const std::string out = read(log);
  EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << describe(status) << "\n"
                                                                                        << out;
  EXPECT_NE(out.find("[launch] stopped by signal 2; not restarting"), std::string::npos) << out;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (alive(rank) && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(alive(rank)) << "the rank (pid " << rank << ") outlived its job";
  ::kill(rank, SIGKILL);
}
