// `titan plan`: what a parallel plan does before it runs. Today: --pp-schedule, the pipeline
// schedules' action lists replayed by the simulator (bubble fraction, peak micro-batches in flight).
#pragma once

namespace titan::cli {

// argv[0] is "plan". Returns the process exit code: 0 done (or --help), 1 failed, 2 bad usage.
int plan_main(int argc, char** argv);

}  // namespace titan::cli
