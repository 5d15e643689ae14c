// The watchdog: a rank that skips a collective makes the others' watchdog fire within the
// timeout; every rank's flight recorder is dumped; the job ends with one message naming the
// collective, its sequence id and the rank that never arrived; `titan fr analyze` says the same.
// A stuck receive is named against its channel's missing send. The calls that block the
// communication thread (MPI_Init, MPI_Comm_split, the barrier at the end) have a deadline of their
// own, and an exception on that thread reaches the callers' wait() as an error.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/cli/fr_cli.h"
#include "titan/distributed/flight_recorder.h"

namespace fs = std::filesystem;

namespace {

// Runs a command, returning its exit status and what it wrote (stdout and stderr).
std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, out};
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  return {pclose(p), out};
}

// The worker under mpirun -np 2 in `mode` with a 2 s timeout: its exit status, output and seconds.
struct Job {
  int status = 0;
  std::string out;
  double seconds = 0;
};
Job run_worker(const fs::path& dir, const std::string& mode) {
  fs::remove_all(dir);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  const auto t0 = std::chrono::steady_clock::now();
  Job j;
  std::tie(j.status, j.out) =
      run(std::string(TITAN_MPIEXEC) + " -np 2 " + TITAN_WATCHDOG_WORKER + " " + dir.string() + " 2 " + mode);
  j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return j;
}

fs::path temp_dir(const std::string& name) {
  return fs::temp_directory_path() / ("titan_watchdog_" + name + "_" + std::to_string(::getpid()));
}

}  // namespace

TEST(Watchdog, ASkippedCollectiveIsNamedAndDumped) {
  const fs::path dir = fs::temp_directory_path() / ("titan_watchdog_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const auto [status, out] = run(std::string(TITAN_MPIEXEC) + " -np 2 " + TITAN_WATCHDOG_WORKER + " " + dir.string() + " 2");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(status, 0) << out;
  EXPECT_LT(seconds, 40) << "the job hung instead of ending (rank 1 sleeps 60 s)\n" << out;
  // The world group's collectives: #1-#3 the three all-reduces, #4 the one rank 1 skipped.
  EXPECT_NE(out.find("titan: rank 0: all_reduce #4 on group world [0, 1] did not finish within 2 s; never arrived: "
                     "rank 1 (its last on the group is #3)"),
            std::string::npos)
      << out;
  for (int r : {0, 1}) {
    ASSERT_TRUE(fs::exists(titan::distributed::flight_dump_path(dir, r))) << "rank " << r << "\n" << out;
    const auto dump = nlohmann::json::parse(std::ifstream(titan::distributed::flight_dump_path(dir, r)));
    EXPECT_EQ(dump["rank"], r);
    EXPECT_EQ(dump["entries"].back()["op"], "all_reduce");
    EXPECT_EQ(dump["entries"].back()["state"], r == 0 ? "started" : "completed");
  }
  const std::string report = titan::distributed::analyze_flight_dumps(dir);
  EXPECT_NE(report.find("rank(s) 1 never reached #4 all_reduce (f32, 1000 -> 1000 elements, started) that rank(s) 0 entered"),
            std::string::npos)
      << report;
  // The same through `titan fr analyze DIR`.
  std::string dir_arg = dir.string(), fr = "fr", analyze = "analyze";
  char* argv[] = {fr.data(), analyze.data(), dir_arg.data()};
  testing::internal::CaptureStdout();
  EXPECT_EQ(titan::cli::fr_main(3, argv), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), report);
  fs::remove_all(dir);
}

// Point-to-point transfers count per channel (sender, receiver, tag): rank 1's fourth receive with
// tag 0 is named against rank 0's missing fourth send with tag 0 (its two sends with tag 1 and the
// all-reduce before them count apart), here and in `titan fr analyze`.
TEST(Watchdog, AStuckReceiveIsNamedAgainstItsSend) {
  const fs::path dir = temp_dir("p2p");
  const Job j = run_worker(dir, "p2p");
  EXPECT_NE(j.status, 0) << j.out;
  EXPECT_LT(j.seconds, 40) << j.out;
  EXPECT_NE(j.out.find("titan: rank 1: recv 0->1 #4 (tag 0) on group world [0, 1] did not finish within 2 s; never "
                       "arrived: rank 0 (its last send 0->1 with tag 0 on the group is #3)"),
            std::string::npos)
      << j.out;
  const std::string report = titan::distributed::analyze_flight_dumps(dir);
  EXPECT_NE(report.find("group world [0, 1]: transfer 0->1 tag 0 #4: rank 0 never posted the send that rank 1's #4 "
                        "recv 0->1 (f32, 0 -> 1000 elements, started) waits for; rank 0's last send on the channel is "
                        "#3 send 0->1 (f32, 1000 -> 0 elements, completed)"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("transfer 0->1 tag 1"), std::string::npos) << report;  // that channel agrees
  EXPECT_NE(report.find("group world [0, 1]: ranks agree on collectives #1..#1, all completed"), std::string::npos)
      << report;
  fs::remove_all(dir);
}

namespace {

// The worker in `mode` has rank 1 sleep 60 s where rank 0 blocks: the deadline ends the job well
// before, with `message` (and, if `dumps`, rank 0's flight-recorder dump).
void expect_deadline_ends_the_job(const std::string& mode, const std::string& message, bool dumps = false) {
  const fs::path dir = temp_dir(mode);
  const Job j = run_worker(dir, mode);
  EXPECT_NE(j.status, 0) << j.out;
  EXPECT_LT(j.seconds, 40) << "the job hung instead of ending (rank 1 sleeps 60 s)\n" << j.out;
  EXPECT_NE(j.out.find(message), std::string::npos) << j.out;
  if (dumps) EXPECT_TRUE(fs::exists(titan::distributed::flight_dump_path(dir, 0))) << j.out;
  fs::remove_all(dir);
}

}  // namespace

// A member that never calls MPI_Comm_split holds the others inside it, where the watchdog cannot
// see them: the start-up deadline ends the job naming the split and dumps the recorder.
TEST(Watchdog, ASplitARankNeverReachesEndsTheJob) {
  expect_deadline_ends_the_job("split", "titan: rank 0: MPI_Comm_split of group world [0, 1] (#4, making group half) did "
                                        "not finish within 2 s (comm.init_timeout_seconds): a rank of the job did not "
                                        "reach it",
                               /*dumps=*/true);
}

// A rank that never reaches the end holds the others in the final barrier: its deadline ends the job.
TEST(Watchdog, TheFinalBarrierHasADeadline) {
  expect_deadline_ends_the_job("stop", "titan: rank 0: the barrier at the job's end (every rank finishing) did not "
                                       "finish within 2 s");
}

// A rank that never starts MPI holds the others in MPI_Init: its deadline ends the job.
TEST(Watchdog, MpiInitHasADeadline) {
  expect_deadline_ends_the_job("init", "titan: rank 0: MPI_Init did not finish within 2 s (comm.init_timeout_seconds)");
}

// An exception on the communication thread (here injected) fails the request it worked on and every
// later one with an error naming it, which wait() throws; the process does not std::terminate.
TEST(Watchdog, ACommunicationThreadFailureReachesTheCallers) {
  const fs::path dir = temp_dir("throw");
  const Job j = run_worker(dir, "throw");
  EXPECT_EQ(j.out.find("terminate called"), std::string::npos) << j.out;
  for (int r : {0, 1}) {
    const std::string failed = fmt::format(
        "the communication thread of rank {} failed while starting all_reduce #1 on group world [0, 1]: injected by "
        "watchdog_worker", r);
    EXPECT_NE(j.out.find(fmt::format("rank {} caught: all_reduce #1 on group world [0, 1] failed: {}", r, failed)),
              std::string::npos)
        << j.out;
    EXPECT_NE(j.out.find(fmt::format("rank {} caught: all_reduce #2 on group world [0, 1] was not started: {}", r,
                                     failed)),
              std::string::npos)
        << j.out;
    EXPECT_NE(j.out.find(fmt::format("rank {}: a failed request settles without throwing", r)), std::string::npos)
        << j.out;
    ASSERT_TRUE(fs::exists(titan::distributed::flight_dump_path(dir, r))) << j.out;
    const auto dump = nlohmann::json::parse(std::ifstream(titan::distributed::flight_dump_path(dir, r)));
    EXPECT_NE(dump["reason"].get<std::string>().find("communication thread failed"), std::string::npos) << dump;
  }
  fs::remove_all(dir);
}
