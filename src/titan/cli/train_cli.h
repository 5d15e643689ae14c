// `titan train --config FILE.toml [--section.key=value ...]`: one training run.
#pragma once

#include <string>
#include <vector>

namespace titan::cli {

// The command line of `titan train`: the config file and the --section.key=value overrides.
struct TrainArgs {
  std::string config_path;
  std::vector<std::string> overrides;
  bool help = false;
};
// argv[0] is "train". Throws titan::Error for a missing --config.
TrainArgs parse_train_args(int argc, char** argv);

// argv[0] is "train". Returns the process exit code: 0 done (or --help); errors throw titan::Error.
int train_main(int argc, char** argv);

}  // namespace titan::cli
