// Pipeline bubbles, measured against the simulator (issue "Distributed training 3"). Trains the
// config with each schedule over every rank of the job as pipeline ranks (mpirun -np P, one
// thread each) and reports per schedule, over the steps after the warm-up:
//   measured   1 - sum of the ranks' compute time / (ranks x the step's time), the executor's times
//   simulated  the simulator's bubble for the same action lists with each stage's F, I, W costs
//              measured in this run (B-only schedules: I = W = B / 2, which leaves B's sum as measured)
//   replayed   the simulator's bubble with each action's own cost measured in this run (its mean
//              over the steps): what the "per-action costs measured on the real model" asks
//   both with the transfer measured by a ping-pong of one activation and each send's hand-over time
//   closed     the closed form with equal stages (distributed.md section 6), where one exists
// and the peak micro-batches in flight per rank. One JSON line per schedule on rank 0.
//   mpirun -np 2 bench_pipeline [--config C] [--steps N] [--warmup K] [--schedules A,B] [--section.key=value ...]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
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

struct Measured {
  double busy = 0, makespan = 0;     // summed over the measured steps: all ranks' compute, the slowest rank's step
  double waiting = 0, sending = 0;   // ... all ranks' waits for inputs, hand-overs of sends
  double sends = 0;                  // ... all ranks' send actions
  std::vector<double> stage_sums;    // per stage x {F, B, I, W}: seconds, then counts
  std::vector<double> action_sums;   // every rank's list one after the other: each action's seconds
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

json run_schedule(const std::string& config_path, const std::string& schedule, int steps, int warmup,
                  std::vector<std::string> overrides) {
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
    size_t offset = 0, actions = 0;  // where this rank's list starts in action_sums; all lists' length
    for (int r = 0; r < p; ++r) {
      if (r == world.rank()) offset = actions;
      actions += sched.actions[size_t(r)].size();
    }
    m.action_sums.assign(actions, 0.0);
    transfer = transfer_seconds(world, trainer.model().stage_activation_shape(
                                           c.parallelism.pipeline_parallel_microbatch_size, c.training.seq_len),
                                trainer.model().compute_dtype());
    trainer.on_step_end = [&](int64_t step) {
      if (step <= warmup) return;
      const pp::ExecutorTimes& t = ex.times();
      std::vector<double> sums = {t.busy(), t.waiting, t.sending, double(t.sends)}, total = {t.total};
      world.all_reduce(std::span<double>(sums));
      world.all_reduce(std::span<double>(total), distributed::ReduceOp::max);
      m.busy += sums[0];
      m.waiting += sums[1];
      m.sending += sums[2];
      m.sends += sums[3];
      m.makespan += total[0];
      for (size_t i = 0; i < t.action_seconds.size(); ++i) m.action_sums[offset + i] += t.action_seconds[i];
      for (const auto& [stage, st] : t.stages)
        for (int k = 0; k < 4; ++k) {
          m.stage_sums[size_t(stage) * 8 + size_t(k)] += st.seconds[k];
          m.stage_sums[size_t(stage) * 8 + 4 + size_t(k)] += st.count[k];
        }
    };
    trainer.train();
  }
  world.all_reduce(std::span<double>(m.stage_sums));
  world.all_reduce(std::span<double>(m.action_sums));
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
  // The replay: every action at its own mean measured time (the per-action costs).
  pp::Costs replay = costs;
  for (size_t r = 0, at = 0; r < size_t(p); at += sched.actions[r].size(), ++r) {
    replay.per_action.emplace_back(m.action_sums.begin() + long(at), m.action_sums.begin() + long(at + sched.actions[r].size()));
    for (double& x : replay.per_action.back()) x /= steps;
  }
  const pp::Simulation replayed = pp::simulate(sched, replay);
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
          {"bubble_replayed", replayed.bubble_fraction},
          {"measured_over_replayed", measured / replayed.bubble_fraction},
          {"bubble_closed_form", pp::closed_form_bubble_fraction(schedule, p, sched.microbatches, sched.stages_per_rank)},
          {"measured_over_simulated", measured / sim.bubble_fraction},
          {"peak_in_flight", peak},
          // Shares of the ranks' time (p x makespan): waiting for inputs, handing sends over, the rest
          // outside compute (bookkeeping); and the per-transfer costs the simulation used.
          {"waiting_share", m.waiting / (double(p) * m.makespan)},
          {"sending_share", m.sending / (double(p) * m.makespan)},
          {"other_share", 1 - (m.busy + m.waiting + m.sending) / (double(p) * m.makespan)},
          {"transfer_ms", 1e3 * costs.transfer},
          {"send_ms", 1e3 * costs.send}};
}

int run(int argc, char** argv) {
  std::string config_path = "configs/llama3_debug.toml";
  int steps = 8, warmup = 2;
  std::vector<std::string> schedules = pp::schedule_names(), overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config_path = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::stoi(argv[++i]);
    else if (a == "--schedules" && i + 1 < argc) {
      schedules.clear();
      std::stringstream list(argv[++i]);
      for (std::string s; std::getline(list, s, ',');) schedules.push_back(s);
    } else overrides.push_back(a);
  }
  distributed::CommEngine& engine = distributed::init_runtime();
  std::vector<json> results;
  for (const std::string& schedule : schedules) {
    std::fflush(stdout);  // the trainer's log would bury the results
    const int saved = dup(1), null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    const json r = run_schedule(config_path, schedule, steps, warmup, overrides);
    std::fflush(stdout);
    dup2(saved, 1);
    close(null), close(saved);
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
