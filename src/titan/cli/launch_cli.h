// `titan launch -np N [--max-restarts K] -- train --config FILE.toml [...]`: a supervisor that runs
// the training job under mpirun and, when a rank dies (killed, out of memory, a watchdog abort on
// a hang), starts it again from the last committed checkpoint, up to K times. Each restart is
// logged with its cause, the steps lost and the time until training runs again, on the console
// and in <dump_folder>/restarts.jsonl.
#pragma once

namespace titan::cli {

// argv[0] is "launch". Returns the job's exit code (0 once a run finishes).
int launch_main(int argc, char** argv);

}  // namespace titan::cli
