#include "titan/cli/plan_cli.h"

#include <cstdio>
#include <string>

#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/pipeline_simulator.h"

namespace titan::cli {

namespace {

constexpr const char* kUsage =
    "usage: titan plan --pp-schedule NAME|all --pp N --microbatches M [options]\n"
    "\n"
    "Replays the pipeline schedule's per-rank action lists (each checked: every forward before its\n"
    "backward, every send received, no deadlock) and prints its bubble fraction, the closed form where\n"
    "one is known, and the peak number of micro-batches in flight on each rank.\n"
    "\n"
    "  --pp-schedule NAME      GPipe, 1F1B, Interleaved1F1B, ZBVZeroBubble, DualPipeV, or all\n"
    "  --pp N                  pipeline ranks\n"
    "  --microbatches M        micro-batches per step\n"
    "  --stages-per-rank V     Interleaved1F1B's stages per rank (default 2)\n"
    "  --forward F             cost of one rank's share of the model, forward (default 1)\n"
    "  --backward-input I      ... backward for the inputs (default 1)\n"
    "  --backward-weight W     ... backward for the weights (default 1; B = I + W)\n"
    "  --transfer T            cost of one activation or gradient between ranks (default 0)\n"
    "  --actions               also print every rank's action list\n"
    "Costs are per rank-sized stage; schedules with v stages per rank run stages of 1/v of it.\n";

struct Options {
  std::string schedule;
  int ranks = 0, microbatches = 0, stages_per_rank = 0;
  distributed::pp::StageCosts cost;
  double transfer = 0;
  bool actions = false;
};

Options parse(const std::vector<std::string_view>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    if (flag == "--actions") {
      o.actions = true;
      continue;
    }
    if (i + 1 >= args.size()) throw UsageError{fmt::format("{} needs a value", flag)};
    const std::string_view value = args[++i];
    if (flag == "--pp-schedule") o.schedule = std::string(value);
    else if (flag == "--pp") o.ranks = parse_number<int>(flag, value);
    else if (flag == "--microbatches") o.microbatches = parse_number<int>(flag, value);
    else if (flag == "--stages-per-rank") o.stages_per_rank = parse_number<int>(flag, value);
    else if (flag == "--forward") o.cost.forward = parse_number<double>(flag, value);
    else if (flag == "--backward-input") o.cost.backward_input = parse_number<double>(flag, value);
    else if (flag == "--backward-weight") o.cost.backward_weight = parse_number<double>(flag, value);
    else if (flag == "--transfer") o.transfer = parse_number<double>(flag, value);
    else throw UsageError{fmt::format("unknown option '{}'", flag)};
  }
  if (o.schedule.empty() || o.ranks < 1 || o.microbatches < 1)
    throw UsageError{"--pp-schedule, --pp (>= 1) and --microbatches (>= 1) are required"};
  return o;
}

void print_schedule(const std::string& name, const Options& o) {
  namespace pp = distributed::pp;
  const pp::Schedule s = pp::make_schedule(name, o.ranks, o.microbatches, name == "Interleaved1F1B" ? o.stages_per_rank : 0);
  pp::check_schedule(s);
  const double v = s.stages_per_rank;
  const pp::Costs costs{{{o.cost.forward / v, o.cost.backward_input / v, o.cost.backward_weight / v}}, o.transfer};
  const pp::Simulation sim = pp::simulate(s, costs);
  const double closed = pp::closed_form_bubble_fraction(name, s.ranks, s.microbatches, s.stages_per_rank, o.cost);
  std::string peaks;
  for (const int n : sim.peak_in_flight) peaks.append(" ").append(std::to_string(n));
  std::printf("%-16s %5d %10.4f %12s %11.3f  %s\n", name.c_str(), s.stages_per_rank, sim.bubble_fraction,
              closed >= 0 ? fmt::format("{:.4f}", closed).c_str() : "-", sim.makespan, peaks.c_str());
  if (o.actions) std::fputs(pp::schedule_str(s).c_str(), stdout);
}

}  // namespace

int plan_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("plan", kUsage, [&] {
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    const Options o = parse(args);
    std::printf("pipeline schedules: %d ranks, %d micro-batches; per rank-sized stage F %g, I %g, W %g, transfer %g\n",
                o.ranks, o.microbatches, o.cost.forward, o.cost.backward_input, o.cost.backward_weight, o.transfer);
    std::printf("%-16s %5s %10s %12s %11s  %s\n", "schedule", "v", "bubble", "closed form", "makespan",
                "peak micro-batches in flight per rank");
    if (o.schedule != "all") {
      print_schedule(o.schedule, o);
      return 0;
    }
    for (const std::string& name : distributed::pp::schedule_names()) {
      try {
        print_schedule(name, o);
      } catch (const Error& e) {  // e.g. too few micro-batches for this one: say so, go on
        std::printf("%-16s %s\n", name.c_str(), e.message().c_str());
      }
    }
    return 0;
  });
}

}  // namespace titan::cli
