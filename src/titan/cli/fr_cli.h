// `titan fr analyze DIR`: reads the flight-recorder dumps the watchdog wrote (one rank*.json per
// rank) and reports, per process group, the first collective where the ranks diverge.
#pragma once

namespace titan::cli {

// argv[0] is "fr". Returns the process exit code: 0 done (or --help), 1 failed, 2 bad usage.
int fr_main(int argc, char** argv);

}  // namespace titan::cli
