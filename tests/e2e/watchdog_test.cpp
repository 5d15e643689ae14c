// The watchdog: a rank that skips a collective makes the others' watchdog fire within the
// timeout; every rank's flight recorder is dumped; the job ends with one message naming the
// collective, its sequence id and the rank that never arrived; `titan fr analyze` says the same.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

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
