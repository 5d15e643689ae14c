// Distributed training, measured: one run of the trainer (1 rank, or under mpirun DDP / FSDP /
// HSDP / TP / CP) on a config, timed after warm-up steps. Prints, as one JSON line from rank 0:
//   tokens/s (global), seconds per step, the exposed communication share (time ranks spent
//   blocked waiting for collectives over the step time, the largest of any rank),
//   per rank the parameter + gradient + optimizer bytes live after a step, the peak and the
//   activations' peak, every group's bytes sent per step by collective type,
//   and per collective type the bytes this rank sent per step against the analytic minimum of
//   the plan (reference distributed.md section 9: all-gather (N-1)/N of each unit's parameters,
//   twice per micro-batch for units freed after forward; reduce-scatter (N-1)/N of the f32
//   gradients per micro-batch; HSDP's all-reduce 2(R-1)/R of a shard's; DDP's 2(N-1)/N of all).
// bench/distributed.sh runs the comparisons (FSDP 2 x 1 thread against 1 rank x 2 threads, ...).
//
//   [mpirun -np N] bench_distributed --config configs/llama3_debug.toml [--steps 12] [--warmup 3]
//                                    [--section.key=value ...]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/core/allocator.h"
#include "titan/core/parallel.h"
#include "titan/distributed/comm_engine.h"
#include "titan/distributed/runtime.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/llama3/model.h"
#include "titan/train/config.h"
#include "titan/train/memory_plan.h"
#include "titan/train/trainer.h"

using namespace titan;
using nlohmann::json;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct PlanBytes {
  double all_gather = 0, reduce_scatter = 0, replicate_all_reduce = 0, ddp_all_reduce = 0;
};

// The plan's minimum bytes per step this rank must send (train/memory_plan.h, `titan plan`).
PlanBytes analytic_minimum(const train::JobConfig& c, int world, const std::string& source) {
  PlanBytes out;
  for (const train::PlanCollective& t : train::plan_memory(c, world, train::tokenizer_vocab(c), source).traffic) {
    if (t.group == "fsdp" && t.op == "all_gather") out.all_gather = t.bytes;
    if (t.group == "fsdp" && t.op == "reduce_scatter") out.reduce_scatter = t.bytes;
    if (t.group == "dp_replicate" && t.op == "all_reduce") (t.what.starts_with("HSDP") ? out.replicate_all_reduce : out.ddp_all_reduce) = t.bytes;
  }
  return out;
}

}  // namespace

int run(int argc, char** argv) {
  std::string config_path = "configs/llama3_debug.toml";
  int steps = 12, warmup = 3;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) config_path = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::stoi(argv[++i]);
    else overrides.push_back(a);
  }
  distributed::CommEngine& engine = distributed::init_runtime();
  const int rank = engine.world_rank();
  overrides.insert(overrides.end(), {"--training.steps=" + std::to_string(warmup + steps), "--checkpoint.enable=false",
                                     "--validation.enable=false", "--metrics.log_freq=1000",
                                     "--job.dump_folder=/tmp/titan_bench_distributed_" + std::to_string(::getpid())});
  train::JobConfig c = train::load_config(config_path, overrides);
  const int world = engine.world_size();
  const int replicate = int(c.parallelism.data_parallel_replicate_degree);
  const int tp = int(c.parallelism.tensor_parallel_degree), cp = int(c.parallelism.context_parallel_degree);
  const int shard = int(c.parallelism.data_parallel_shard_degree == -1 ? world / (replicate * tp * cp)
                                                                       : c.parallelism.data_parallel_shard_degree);
  const int fsdp = shard * cp;  // FSDP shards over dp_shard x cp
  const int64_t accum = train::gradient_accumulation_steps(c, replicate * shard);
  std::vector<double> ends;
  double exposed0 = 0;
  MemoryStats after_step;
  PlanBytes minimum;
  json dims = json::object();  // the attention widths, for the CP traffic comparisons
  // The trainer's own log would bury the result: stdout goes to /dev/null while it runs.
  std::fflush(stdout);
  const int saved = dup(1), null = open("/dev/null", O_WRONLY);
  dup2(null, 1);
  {
    train::Trainer trainer(c, config_path);
    minimum = analytic_minimum(c, world, config_path);
    if (auto* ds = dynamic_cast<models::deepseek_v3::Transformer*>(&trainer.model())) {
      const auto& a = ds->args();
      dims = {{"n_layers", a.n_layers},         {"n_dense_layers", a.n_dense_layers}, {"n_heads", a.n_heads},
              {"kv_lora_rank", a.kv_lora_rank},
              {"qk_rope_head_dim", a.qk_rope_head_dim}, {"qk_nope_head_dim", a.qk_nope_head_dim},
              {"v_head_dim", a.v_head_dim},     {"index_head_dim", a.index_head_dim}};
    }
    if (auto* ll = dynamic_cast<models::llama3::Transformer*>(&trainer.model())) {
      const auto& a = ll->args();
      dims = {{"n_layers", a.n_layers}, {"n_heads", a.n_heads}, {"n_kv_heads", a.kv_heads()}, {"head_dim", a.head_dim()}};
    }
    trainer.on_step_end = [&](int64_t step) {
      if (step == warmup) {
        engine.reset_stats();
        exposed0 = engine.exposed_seconds();
        memory_reset_peak();
      }
      if (step >= warmup) ends.push_back(now());
      if (step == warmup + steps) after_step = memory_stats();
    };
    trainer.train();
  }
  std::fflush(stdout);
  dup2(saved, 1);
  close(null);
  close(saved);
  std::vector<double> per_step;
  for (size_t i = 1; i < ends.size(); ++i) per_step.push_back(ends[i] - ends[i - 1]);
  std::sort(per_step.begin(), per_step.end());
  const double median = per_step.empty() ? 0 : per_step[per_step.size() / 2];
  const double wall = ends.back() - ends.front();
  std::vector<double> worst = {(engine.exposed_seconds() - exposed0) / wall};
  engine.world().all_reduce(std::span<double>(worst), distributed::ReduceOp::max);
  // Traffic per step by collective type, this rank's.
  std::map<std::string, double> issued;
  json by_group = json::object();  // every group's traffic, e.g. "tp all_gather", "cp reduce_scatter"
  for (const auto& [key, s] : engine.stats()) {
    const auto& [group, op] = key;
    if (s.bytes > 0) by_group[group + " " + distributed::comm_op_name(op)] = double(s.bytes) / steps;
    if (group == "fsdp" && op == distributed::CommOp::all_gather) issued["all_gather"] += double(s.bytes) / steps;
    if (group == "fsdp" && op == distributed::CommOp::reduce_scatter) issued["reduce_scatter"] += double(s.bytes) / steps;
    if (group == "dp_replicate" && op == distributed::CommOp::all_reduce) {
      if (fsdp > 1) issued["replicate_all_reduce"] += double(s.bytes) / steps;
      else issued["ddp_all_reduce"] += double(s.bytes) / steps;
    }
    if (group == "loss" || group == "world") issued["scalars"] += double(s.bytes) / steps;
  }
  const auto entry = [&](const std::string& name, double want) {
    const double got = issued.count(name) ? issued.at(name) : 0.0;
    return json{{"bytes_per_step", got}, {"minimum", want}, {"ratio", want > 0 ? got / want : 0.0}};
  };
  const int64_t pgo = after_step.live[int(MemCategory::parameters)] + after_step.live[int(MemCategory::gradients)] +
                      after_step.live[int(MemCategory::optimizer_state)];
  std::vector<double> mem = {double(pgo), double(after_step.peak_total),
                             double(after_step.peak[int(MemCategory::activations)])};
  engine.world().all_reduce(std::span<double>(mem), distributed::ReduceOp::max);
  const double tokens = double(c.training.local_batch_size * c.training.seq_len * accum) * replicate * shard;
  if (rank == 0) {
    json out = {{"ranks", world},
                {"threads_per_rank", num_threads()},
                {"replicate", replicate},
                {"shard", shard},
                {"tp", tp},
                {"cp", cp},
                {"seq_len", c.training.seq_len},
                {"local_batch_size", c.training.local_batch_size},
                {"activation_checkpoint", std::string(name_of(c.activation_checkpoint.mode))},
                {"compute_bytes", dtype_bits(c.training.mixed_precision_param) / 8},
                {"model_dims", dims},
                {"seconds_per_step", median},
                {"tokens_per_second", tokens / median},
                {"exposed_comm_share", worst[0]},
                {"params_grads_optimizer_bytes_per_rank", mem[0]},
                {"peak_bytes_per_rank", mem[1]},
                {"activation_peak_bytes_per_rank", mem[2]},
                {"traffic_by_group", by_group},
                {"traffic",
                 {{"all_gather", entry("all_gather", minimum.all_gather)},
                  {"reduce_scatter", entry("reduce_scatter", minimum.reduce_scatter)},
                  {"replicate_all_reduce", entry("replicate_all_reduce", minimum.replicate_all_reduce)},
                  {"ddp_all_reduce", entry("ddp_all_reduce", minimum.ddp_all_reduce)},
                  {"scalars_bytes_per_step", issued.count("scalars") ? issued.at("scalars") : 0.0}}}};
    std::printf("%s\n", out.dump().c_str());
  }
  distributed::shutdown_runtime();
  return 0;
}

// A bad config or a missing dataset: the error and exit status 1, every rank ending (as titan does).
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_distributed: error: %s\n", e.what());
    distributed::CommEngine& engine = distributed::CommEngine::get();
    if (engine.uses_mpi() && engine.world_size() > 1) engine.abort(1);
    distributed::shutdown_runtime();
    return 1;
  }
}
