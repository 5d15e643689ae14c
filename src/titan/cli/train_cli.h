// `titan train --config FILE.toml [--section.key=value ...]`: one training run.
#pragma once

namespace titan::cli {

// argv[0] is "train". Returns the process exit code: 0 done (or --help); errors throw titan::Error.
int train_main(int argc, char** argv);

}  // namespace titan::cli
