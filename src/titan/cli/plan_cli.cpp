#include "titan/cli/plan_cli.h"

#include <cstdio>
#include <numeric>
#include <string>

#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/pipeline_simulator.h"
#include "titan/train/config.h"
#include "titan/train/memory_plan.h"

namespace titan::cli {

namespace {

constexpr const char* kUsage =
    "usage: titan plan --config C.toml [--world-size N] [--device-memory GiB[,GiB...]] [--vocab V] [--section.key=value ...]\n"
    "       titan plan --pp-schedule NAME|all --pp N --microbatches M [options]\n"
    "\n"
    "With --config: the job's memory and communication plan, without allocating anything: per rank\n"
    "(the busiest pipeline rank) the peak bytes by category (parameters, gradients, optimizer state,\n"
    "resident or swapped, activations for the checkpointing mode and the micro-batches in flight,\n"
    "temporaries) with the terms behind them, and the bytes each collective sends per step.\n"
    "  --world-size N          ranks (default: the product of the configured degrees, dp_shard 1 if -1)\n"
    "  --device-memory GiB     also print the smallest world size (dp_shard grown) whose peak fits\n"
    "                          (several sizes, comma-separated: a line each)\n"

    "  --vocab V               vocabulary size (default: the tokenizer's, else the flavor's own)\n"
    "  --json                  the plan as JSON (bytes per category and term, traffic per collective)\n"
    "  --section.key=value     config overrides, as titan train takes them\n"
    "\n"
    "With --pp-schedule:\n"
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

void print_schedule(distributed::pp::ScheduleKind kind, const Options& o) {
  namespace pp = distributed::pp;
  // --stages-per-rank chooses only for the one schedule whose stage count is free.
  const pp::Schedule s =
      pp::make_schedule(kind, o.ranks, o.microbatches, kind == pp::ScheduleKind::interleaved_1f1b ? o.stages_per_rank : 0);
  pp::check_schedule(s);
  const double v = s.stages_per_rank;
  const pp::Costs costs{{{o.cost.forward / v, o.cost.backward_input / v, o.cost.backward_weight / v}}, o.transfer};
  const pp::Simulation sim = pp::simulate(s, costs);
  const double closed = pp::closed_form_bubble_fraction(kind, s.ranks, s.microbatches, s.stages_per_rank, o.cost);
  std::string peaks;
  for (const int n : sim.peak_in_flight) peaks.append(" ").append(std::to_string(n));
  std::printf("%-16s %5d %10.4f %12s %11.3f  %s\n", s.name.c_str(), s.stages_per_rank, sim.bubble_fraction,
              closed >= 0 ? fmt::format("{:.4f}", closed).c_str() : "-", sim.makespan, peaks.c_str());
  if (o.actions) std::fputs(pp::schedule_str(s).c_str(), stdout);
}

struct ConfigOptions {
  std::string config;
  int world = 0;
  std::vector<double> device_gib;
  int64_t vocab = 0;
  bool json = false;
  std::vector<std::string> overrides;
};

ConfigOptions parse_config_mode(const std::vector<std::string_view>& args) {
  ConfigOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view flag = args[i];
    if (flag.starts_with("--") && flag.find('=') != std::string_view::npos && flag.find('.') < flag.find('=')) {
      o.overrides.emplace_back(flag);
      continue;
    }
    if (flag == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 >= args.size()) throw UsageError{fmt::format("{} needs a value", flag)};
    const std::string_view value = args[++i];
    if (flag == "--config") o.config = std::string(value);
    else if (flag == "--world-size") o.world = parse_number<int>(flag, value);
    else if (flag == "--device-memory")
      for (size_t at = 0; at <= value.size();) {
        const size_t comma = std::min(value.find(',', at), value.size());
        o.device_gib.push_back(parse_number<double>(flag, value.substr(at, comma - at)));
        at = comma + 1;
      }
    else if (flag == "--vocab") o.vocab = parse_number<int64_t>(flag, value);
    else throw UsageError{fmt::format("unknown option '{}'", flag)};
  }
  return o;
}

int plan_config(const std::vector<std::string_view>& args) {
  const ConfigOptions o = parse_config_mode(args);
  const train::JobConfig c = train::load_config(o.config, o.overrides);
  const train::Parallelism& p = c.parallelism;
  // Default: the configured degrees, dp_shard = -1 read as the fewest ranks expert parallelism
  // can borrow its ranks from (dp_shard x cp x tp a multiple of ep; dp_shard x cp under the
  // gather scheme, whose experts are split over TP).
  const int64_t others = p.context_parallel_degree * p.tensor_parallel_degree;
  const int64_t borrowed = p.experts_split_over_tp() ? p.context_parallel_degree : others;
  const int64_t shard = p.data_parallel_shard_degree > 0 ? p.data_parallel_shard_degree
                                                         : p.expert_parallel_degree / std::gcd(p.expert_parallel_degree, borrowed);
  const int world = o.world > 0 ? o.world : int(p.pipeline_parallel_degree * p.data_parallel_replicate_degree * shard * others);
  const int64_t vocab = o.vocab > 0 ? o.vocab : train::tokenizer_vocab(c);
  if (o.json) {
    nlohmann::json j = train::plan_json(train::plan_memory(c, world, vocab, o.config));
    for (const double gib : o.device_gib)  // {"<GiB>": world} (0: none fits)
      j["smallest_world"][fmt::format("{:g}", gib)] =
          train::smallest_world(c, vocab, gib * double(int64_t(1) << 30), o.config);
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("%s: %s %s, %lld x %lld tokens per rank, %s, activation checkpointing %s%s\n", o.config.c_str(),
              c.model.name.c_str(), c.model.flavor.c_str(), (long long)c.training.local_batch_size,
              (long long)c.training.seq_len,
              c.training.mixed_precision_param == DType::bf16 ? "bf16 mixed precision" : "f32",
              std::string(name_of(c.activation_checkpoint.mode)).c_str(),
              c.optimizer.swap == train::OptimizerSwap::file ? ", optimizer state swapped to a file" : "");
  const train::MemoryPlan plan = train::plan_memory(c, world, vocab, o.config);
  std::fputs(train::plan_str(plan).c_str(), stdout);
  if (!o.device_gib.empty()) std::printf("\n");
  for (const double gib : o.device_gib) {
    const int fits = train::smallest_world(c, vocab, gib * double(int64_t(1) << 30), o.config);
    if (fits > 0) std::printf("smallest world size that fits %.1f GiB per rank: %d ranks (dp_shard grown)\n", gib, fits);
    else std::printf("no world size fits %.1f GiB per rank by growing dp_shard: raise tp, pp, cp or ep, checkpoint activations, or swap the optimizer\n", gib);
  }
  return 0;
}

}  // namespace

int plan_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("plan", kUsage, [&] {
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    for (const std::string_view a : args)
      if (a == "--config") return plan_config(args);
    const Options o = parse(args);
    std::printf("pipeline schedules: %d ranks, %d micro-batches; per rank-sized stage F %g, I %g, W %g, transfer %g\n",
                o.ranks, o.microbatches, o.cost.forward, o.cost.backward_input, o.cost.backward_weight, o.transfer);
    std::printf("%-16s %5s %10s %12s %11s  %s\n", "schedule", "v", "bubble", "closed form", "makespan",
                "peak micro-batches in flight per rank");
    if (o.schedule != "all") {
      print_schedule(distributed::pp::schedule_named(o.schedule), o);
      return 0;
    }
    for (const auto& [kind, name] : distributed::pp::kScheduleNames) {
      try {
        print_schedule(kind, o);
      } catch (const Error& e) {  // e.g. too few micro-batches for this one: say so, go on
        std::printf("%-16s %s\n", std::string(name).c_str(), e.message().c_str());
      }
    }
    return 0;
  });
}

}  // namespace titan::cli
