// `titan launch`: what it refuses before starting anything. (Restarts themselves run in the chaos
// suite, e2e.chaos: scripts/chaos.sh under ctest.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error_of.h"
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
