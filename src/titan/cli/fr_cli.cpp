#include "titan/cli/fr_cli.h"

#include <cstdio>

#include "titan/cli/args.h"
#include "titan/distributed/flight_recorder.h"

namespace titan::cli {

namespace {

constexpr const char* kUsage =
    "usage: titan fr analyze DIR\n"
    "\n"
    "DIR holds the flight-recorder dumps a watchdog timeout wrote (rank0.json, rank1.json, ...; by default\n"
    "<job.dump_folder>/comm_traces). Prints, for each process group, the first collective some rank never\n"
    "reached or reached with another op, size or dtype; or that the ranks agree.\n";

}  // namespace

int fr_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("fr", kUsage, [&] {
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.size() != 2 || args[0] != "analyze") throw UsageError{"expected: analyze DIR"};
    std::fputs(distributed::analyze_flight_dumps(std::string(args[1])).c_str(), stdout);
    return 0;
  });
}

}  // namespace titan::cli
