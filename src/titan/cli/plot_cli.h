// `titan plot RUN_DIR`: draws a run's plots (train/plots.h) from its metrics.jsonl, and a bar
// chart beside each memory snapshot JSON under it.
#pragma once

namespace titan::cli {

// argv[0] is "plot". Returns the process exit code: 0 done (or --help), 1 failed, 2 bad usage.
int plot_main(int argc, char** argv);

}  // namespace titan::cli
