// Pipeline bubbles, measured against the simulator (issue "Distributed training 3"). Trains the
// config with each schedule over every rank of the job as pipeline ranks (mpirun -np P, one
// thread each) and reports per schedule, over the steps after the warm-up:
//   measured   1 - sum of the ranks' compute time / (ranks x the step's time), the executor's times
//   simulated  the simulator's bubble for the same action lists with each stage's F, I, W costs
//              measured in this run (B-only schedules: I = W = B / 2, which leaves B's sum as measured)
//   replayed   the simulator's bubble with each action's own cost measured in this run, step by
//              step (what the "per-action costs measured on the real model" asks): a step
//              replayed with its own costs has its own jitter, so what the measured bubble has on
//              top is the executor's and the transfers' (a replay at each action's mean over the
//              steps, also given, misses that a step waits for whichever rank was slower in it)
//   both with the transfer measured by a ping-pong of one activation and each send's hand-over time
//   closed     the closed form with equal stages (distributed.md section 6), where one exists
// and the peak micro-batches in flight per rank. One JSON line per schedule on rank 0. With
// --timeline, rank 0 also prints every action's mean measured start against the mean replay's.
// Each schedule runs with each stage split of --splits (first/last_stage_less_layers pairs; by
// default 1/1, the embedding and the head each counted as a block, and 0/0, an even split):
// which balances the ranks best depends on the model and on the schedule's placement (a V puts
// the first and the last stage on one rank). Each line also gives the steal share: the CPU time
// the hypervisor gave other guests during the measured steps, which disturbs every figure.
//   mpirun -np 2 bench_pipeline [--config C] [--steps N] [--warmup K] [--schedules A,B] [--splits F/L,F/L]
//                               [--timeline] [--section.key=value ...]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/distributed/comm_engine.h"
#include "titan/distributed/pipeline_executor.h"
#include "titan/distributed/pipeline_simulator.h"
#include "titan/distributed/runtime.h"
#include "titan/train/config.h"
#include "titan/train/trainer.h"

using namespace titan;
using nlohmann::json;
namespace pp = distributed::pp;

namespace {

// The host's CPU time stolen by other guests of the hypervisor, as a share of all CPU time between
// two readings of /proc/stat (its "steal" column): a run with a large share was disturbed.
struct StealClock {
  double steal = 0, total = 0;
  static StealClock now() {
    StealClock c;
    std::ifstream stat("/proc/stat");
    std::string cpu;
    stat >> cpu;
    for (int field = 0; field < 8 && stat; ++field) {  // user .. steal (guest is inside user)
      double v = 0;
      stat >> v;
      c.total += v;
      if (field == 7) c.steal = v;
    }
    return c;
  }
};
struct StealShare {
  StealClock start, end;
  double share() const { return end.total > start.total ? (end.steal - start.steal) / (end.total - start.total) : 0; }
};

struct Measured {
  double busy = 0, makespan = 0;     // summed over the measured steps: all ranks' compute, the slowest rank's step
  double waiting = 0, sending = 0;   // ... all ranks' waits for inputs, hand-overs of sends
  double sends = 0;                  // ... all ranks' send actions
  std::vector<double> stage_sums;    // per stage x {F, B, I, W}: seconds, then counts
  // Per measured step: every rank's list one after the other, each action's seconds.
  std::vector<std::vector<double>> step_actions;
  std::vector<double> start_sums;    // ... each action's start after the first rank's step began
  double skew = 0;                   // summed over the measured steps: the last rank's step start after the first's
  StealShare steal;                  // over the measured steps
};

// One-way time of an activation between pipeline ranks 0 and 1 through the engine: the median of
// 20 round trips' halves.
double transfer_seconds(const distributed::ProcessGroup& world, const Shape& shape, DType dtype) {
  if (world.size() < 2 || world.rank() > 1) return 0;
  Tensor t = Tensor::zeros(shape, dtype);
  std::vector<double> halves;
  for (int i = 0; i < 21; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (world.rank() == 0) {
      world.send(t, 1, 7).wait();
      world.recv(t, 1, 8).wait();
    } else {
      world.recv(t, 0, 7).wait();
      world.send(t, 0, 8).wait();
    }
    if (i > 0) halves.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2);
  }
  std::sort(halves.begin(), halves.end());
  return halves[halves.size() / 2];
}

// Each stage's mean forward / input-gradient / weight-gradient milliseconds, for reading a split's balance.
json stage_ms(const pp::Costs& costs) {
  json out = json::array();
  for (const pp::StageCosts& sc : costs.stages)
    out.push_back({1e3 * sc.forward, 1e3 * sc.backward_input, 1e3 * sc.backward_weight});
  return out;
}

// Every rank's actions with their mean measured start against the replay's (ms after the first
// rank's step began), and how far the measured run has fallen behind: where latency the replay does
// not model comes in. Compare compute and send rows: a measured receive is when the loop passed it
// (posted ahead), a replayed one when its message arrived.
void print_timeline(const pp::Schedule& sched, const pp::Costs& replay, const pp::Simulation& replayed,
                    const Measured& m, int steps) {
  for (size_t r = 0, at = 0; r < size_t(sched.ranks); at += sched.actions[r].size(), ++r) {
    std::fprintf(stderr, "%s rank %zu: action, measured start, replayed start, behind, cost (ms)\n", sched.name.c_str(), r);
    for (size_t i = 0; i < sched.actions[r].size(); ++i) {
      const double measured = 1e3 * m.start_sums[at + i] / steps, simulated = 1e3 * replayed.start[r][i];
      std::fprintf(stderr, "  %-28s %8.2f %8.2f %7.2f %7.2f\n", pp::action_str(sched.actions[r][i]).c_str(), measured,
                   simulated, measured - simulated, 1e3 * replay.per_action[r][i]);
    }
  }
  std::fprintf(stderr, "%s: the last rank's step began %.2f ms after the first's (mean)\n", sched.name.c_str(),
               1e3 * m.skew / steps);
}

// `costs` with each action of every rank's list at its cost in `flat` (the lists one after the other).
pp::Costs with_action_costs(const pp::Costs& costs, const pp::Schedule& sched, const std::vector<double>& flat) {
  pp::Costs out = costs;
  for (size_t r = 0, at = 0; r < size_t(sched.ranks); at += sched.actions[r].size(), ++r)
    out.per_action.emplace_back(flat.begin() + long(at), flat.begin() + long(at + sched.actions[r].size()));
  return out;
}

// The bubble of every step replayed with its own action costs, over all of them (as the measured
// bubble is: 1 - the ranks' compute / (ranks x the steps' makespans)).
double replay_each_step(const pp::Schedule& sched, const pp::Costs& costs, const std::vector<std::vector<double>>& steps) {
  double busy = 0, makespan = 0;
  for (const std::vector<double>& step : steps) {
    const pp::Simulation one = pp::simulate(sched, with_action_costs(costs, sched, step));
    busy += std::accumulate(one.busy.begin(), one.busy.end(), 0.0);
    makespan += one.makespan;
  }
  return 1 - busy / (double(sched.ranks) * makespan);
}

json run_schedule(const std::string& config_path, const std::string& schedule, int steps, int warmup,
                  std::vector<std::string> overrides, bool timeline) {
  distributed::CommEngine& engine = distributed::CommEngine::get();
  const distributed::ProcessGroup& world = engine.world();
  const int p = world.size();
  overrides.insert(overrides.end(), {"--training.steps=" + std::to_string(warmup + steps), "--checkpoint.enable=false",
                                     "--validation.enable=false", "--metrics.log_freq=1000",
                                     "--parallelism.pipeline_parallel_degree=" + std::to_string(p),
                                     "--parallelism.data_parallel_shard_degree=1",
                                     "--parallelism.pipeline_parallel_schedule=" + schedule,
                                     "--job.dump_folder=/tmp/titan_bench_pipeline_" + std::to_string(::getpid())});
  const train::JobConfig c = train::load_config(config_path, overrides);
  Measured m;
  pp::Schedule sched;
  double transfer = 0;
  {
    train::Trainer trainer(c, config_path);
    const pp::PipelineExecutor& ex = *trainer.pipeline_executor();
    sched = ex.schedule();
    m.stage_sums.assign(size_t(sched.stages()) * 8, 0.0);
    size_t offset = 0, actions = 0;  // where this rank's list starts in step_actions; all lists' length
    for (int r = 0; r < p; ++r) {
      if (r == world.rank()) offset = actions;
      actions += sched.actions[size_t(r)].size();
    }
    m.start_sums.assign(actions, 0.0);
    transfer = transfer_seconds(world, trainer.model().stage_activation_shape(
                                           c.parallelism.pipeline_parallel_microbatch_size, c.training.seq_len),
                                trainer.model().compute_dtype());
    trainer.on_step_end = [&](int64_t step) {
      if (step == warmup) m.steal.start = StealClock::now();
      if (step <= warmup) return;
      m.steal.end = StealClock::now();
      const pp::ExecutorTimes& t = ex.times();
      std::vector<double> sums = {t.busy(), t.waiting, t.sending, double(t.sends)}, total = {t.total},
                          first = {-t.started}, last = {t.started};
      world.all_reduce(std::span<double>(sums));
      world.all_reduce(std::span<double>(total), distributed::ReduceOp::max);
      world.all_reduce(std::span<double>(first), distributed::ReduceOp::max);
      world.all_reduce(std::span<double>(last), distributed::ReduceOp::max);
      m.skew += last[0] + first[0];
      for (size_t i = 0; i < t.action_start.size(); ++i) m.start_sums[offset + i] += t.started + first[0] + t.action_start[i];
      m.busy += sums[0];
      m.waiting += sums[1];
      m.sending += sums[2];
      m.sends += sums[3];
      m.makespan += total[0];
      std::vector<double> seconds(actions, 0.0);
      std::copy(t.action_seconds.begin(), t.action_seconds.end(), seconds.begin() + long(offset));
      world.all_reduce(std::span<double>(seconds));
      m.step_actions.push_back(std::move(seconds));
      for (const auto& [stage, st] : t.stages)
        for (int k = 0; k < 4; ++k) {
          m.stage_sums[size_t(stage) * 8 + size_t(k)] += st.seconds[k];
          m.stage_sums[size_t(stage) * 8 + 4 + size_t(k)] += st.count[k];
        }
    };
    if (warmup == 0) m.steal.start = StealClock::now();
    trainer.train();
  }
  world.all_reduce(std::span<double>(m.stage_sums));
  world.all_reduce(std::span<double>(m.start_sums));
  pp::Costs costs;
  for (int s = 0; s < sched.stages(); ++s) {
    const double* sec = &m.stage_sums[size_t(s) * 8];
    const double* cnt = sec + 4;
    const auto mean = [&](int k) { return cnt[k] > 0 ? sec[k] / cnt[k] : 0.0; };
    pp::StageCosts sc;
    sc.forward = mean(0);
    if (cnt[2] > 0) {
      sc.backward_input = mean(2);
      sc.backward_weight = mean(3);
    } else {
      sc.backward_input = sc.backward_weight = mean(1) / 2;
    }
    costs.stages.push_back(sc);
  }
  std::vector<double> shared = {transfer};  // rank 0's measurement, for every rank's simulation
  world.all_reduce(std::span<double>(shared), distributed::ReduceOp::max);
  costs.transfer = shared[0];
  costs.send = m.sends > 0 ? m.sending / m.sends : 0;
  const pp::Simulation sim = pp::simulate(sched, costs);
  // The replays: every action at its own measured time (the per-action costs), step by
  // step, and once more at each action's mean over the steps.
  const double replayed = replay_each_step(sched, costs, m.step_actions);
  std::vector<double> mean(m.step_actions.front().size(), 0.0);
  for (const std::vector<double>& step : m.step_actions)
    for (size_t i = 0; i < step.size(); ++i) mean[i] += step[i] / double(m.step_actions.size());
  const pp::Costs replay_mean = with_action_costs(costs, sched, mean);
  const pp::Simulation replayed_mean = pp::simulate(sched, replay_mean);
  if (timeline && world.rank() == 0) print_timeline(sched, replay_mean, replayed_mean, m, steps);
  int peak = 0;
  for (int v : sim.peak_in_flight) peak = std::max(peak, v);
  const double measured = 1 - m.busy / (double(p) * m.makespan);
  return {{"schedule", schedule},
          {"ranks", p},
          {"microbatches", sched.microbatches},
          {"stages", sched.stages()},
          {"step_ms", 1e3 * m.makespan / steps},
          {"bubble_measured", measured},
          {"bubble_simulated", sim.bubble_fraction},
          {"bubble_replayed", replayed},
          {"measured_over_replayed", measured / replayed},
          {"bubble_replayed_mean", replayed_mean.bubble_fraction},
          {"bubble_closed_form", pp::closed_form_bubble_fraction(sched.kind, p, sched.microbatches, sched.stages_per_rank)},
          {"measured_over_simulated", measured / sim.bubble_fraction},
          {"peak_in_flight", peak},
          // Shares of the ranks' time (p x makespan): waiting for inputs, handing sends over, the rest
          // outside compute (bookkeeping); and the per-transfer costs the simulation used.
          {"waiting_share", m.waiting / (double(p) * m.makespan)},
          {"sending_share", m.sending / (double(p) * m.makespan)},
          {"other_share", 1 - (m.busy + m.waiting + m.sending) / (double(p) * m.makespan)},
          {"transfer_ms", 1e3 * costs.transfer},
          {"send_ms", 1e3 * costs.send},
          {"stage_ms", stage_ms(costs)},
          {"start_skew_ms", 1e3 * m.skew / steps},
          {"steal_share", m.steal.share()}};
}

int run(int argc, char** argv) {
  std::string config_path = "configs/llama3_debug.toml";
  int steps = 8, warmup = 2;
  bool timeline = false;
  std::vector<std::string> schedules = pp::schedule_names(), splits = {"1/1", "0/0"}, overrides;
  const auto list = [](const std::string& text) {
    std::vector<std::string> out;
    std::stringstream in(text);
    for (std::string s; std::getline(in, s, ',');) out.push_back(s);
    return out;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config_path = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::stoi(argv[++i]);
    else if (a == "--schedules" && i + 1 < argc) schedules = list(argv[++i]);
    else if (a == "--splits" && i + 1 < argc) splits = list(argv[++i]);
    else if (a == "--timeline") timeline = true;
    else overrides.push_back(a);
  }
  // A split the caller gives as keys replaces --splits (it would win over every one of them).
  for (const std::string& o : overrides)
    if (o.find("_stage_less_layers=") != std::string::npos) splits = {"given"};
  TITAN_CHECK(steps > 0, "--steps " + std::to_string(steps) + " measures nothing", "give --steps 1 or more");
  distributed::CommEngine& engine = distributed::init_runtime();
  for (const std::string& schedule : schedules)
    for (const std::string& split : splits) {
      std::vector<std::string> with;
      if (split != "given") {
        const size_t slash = split.find('/');
        TITAN_CHECK(slash != std::string::npos,
                    "bench_pipeline: --splits takes FIRST/LAST less-layers pairs, got " + split, "e.g. --splits 1/1,0/0");
        with = {"--parallelism.pipeline_parallel_first_stage_less_layers=" + split.substr(0, slash),
                "--parallelism.pipeline_parallel_last_stage_less_layers=" + split.substr(slash + 1)};
      }
      with.insert(with.end(), overrides.begin(), overrides.end());
      std::fflush(stdout);  // the trainer's log would bury the results
      const int saved = dup(1), null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      json r = run_schedule(config_path, schedule, steps, warmup, with, timeline);
      std::fflush(stdout);
      dup2(saved, 1);
      close(null), close(saved);
      r["split"] = split;
      if (engine.world_rank() == 0) std::printf("%s\n", r.dump().c_str());
      std::fflush(stdout);
    }
  distributed::shutdown_runtime();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_pipeline: error: %s\n", e.what());
    distributed::CommEngine& engine = distributed::CommEngine::get();
    if (engine.uses_mpi() && engine.world_size() > 1) engine.abort(1);
    distributed::shutdown_runtime();
    return 1;
  }
}
