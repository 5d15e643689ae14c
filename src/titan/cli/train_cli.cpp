#include "titan/cli/train_cli.h"

#include <cstdio>
#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/distributed/comm_engine.h"
#include "titan/train/trainer.h"

namespace titan::cli {

using namespace train;

TrainArgs parse_train_args(int argc, char** argv) {
  TrainArgs out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      out.help = true;
      return out;
    }
    if (a == "--config" || a == "--job.config_file") {
      TITAN_CHECK(i + 1 < argc, a + " needs a file name", "e.g. titan train --config configs/llama3_debug.toml");
      out.config_path = argv[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      out.config_path = a.substr(9);
    } else {
      out.overrides.push_back(a);
      // "--section.key value": the value travels with its key.
      if (a.find('=') == std::string::npos && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
        out.overrides.push_back(argv[++i]);
    }
  }
  TITAN_CHECK(!out.config_path.empty(), "titan train needs --config FILE.toml",
              "e.g. titan train --config configs/llama3_debug.toml");
  return out;
}

int train_main(int argc, char** argv) {
  const TrainArgs args = parse_train_args(argc, argv);
  if (args.help) {
    std::printf("usage: titan train --config FILE.toml [--section.key=value ...]\n\n%s", config_help().c_str());
    return 0;
  }
  const std::string& config_path = args.config_path;
  const JobConfig config = load_config(config_path, args.overrides);
  Trainer trainer(config, config_path);
  const TrainResult r = trainer.train();
  if (distributed::CommEngine::get().world_rank() == 0)
    std::printf("%s at step %lld: loss %.4f%s\n", r.interrupted ? "stopped" : "done",
              static_cast<long long>(r.last_step), r.last_loss,
              r.last_val_loss >= 0 ? (", validation loss " + std::to_string(r.last_val_loss)).c_str() : "");
  return 0;
}

}  // namespace titan::cli
