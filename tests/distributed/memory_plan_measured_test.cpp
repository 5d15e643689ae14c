// The memory planner (train/memory_plan.h) against the peaks real runs measure (metrics.jsonl's
// peak_memory_bytes: each category's largest over the ranks, as the plan's over its pipeline
// ranks), per category, for sixteen runs on 4 ranks: FSDP 4; TP 2 and CP 2 side by side; PP 2 and
// EP 2 (deepseek_v32 with FSDP 2) side by side; llama3 at PP 2 x FSDP 2 (ZeRO-3) under 1F1B, ZB-V
// and DualPipeV; deepseek_v32 at PP 2 x FSDP 2 x EP 2 under 1F1B and DualPipeV; one rank each of
// llama3 (f32, and bf16 with selective checkpointing) and deepseek_v32 (f32, and bf16 with full
// checkpointing); and FSDP 2 pairs saving every step through a 1 MiB staging buffer: async with
// bf16, and with the swap optimizer. Every category must be within 10%, except
// what depends on when the communication engine finishes a reduce-scatter under FSDP: there the
// gradients lie between the plan's two unsharded units and one, and the temporaries between the
// plan with and without the reduce-scatter receive buffers (each within 10%).
#include <memory>

#include "distributed/common.h"
#include "titan/kernels/onednn/matmul.h"
#include "titan/train/memory_plan.h"

using namespace titan;
using namespace titan::test;

namespace {

struct PlannedRun {
  std::string name, model;
  std::vector<std::string> overrides;
};

class PlanMeasured : public TrainingSuite<PlanMeasured, 260> {  // 260: TP 2 divides the vocabulary
 public:
  static constexpr const char* kTag = "plan_measured";

 protected:
  static train::JobConfig config(const PlannedRun& r) {
    std::string toml = base_toml(r.model, data(), root() / r.name, 3);
    std::vector<std::string> o = {"--training.seq_len=256", "--training.local_batch_size=2", "--metrics.enable_plots=false",
                                  "--lr_scheduler.warmup_steps=1"};
    if (r.model == "deepseek_v32")  // the sparse stage from the first step, with the fused kernels
      o.insert(o.end(), {"--dsa.warmup_steps=0", "--dsa.topk=64", "--model.converters=dsa_fused"});
    o.insert(o.end(), r.overrides.begin(), r.overrides.end());
    return train::parse_config(toml, r.name + ".toml", o);
  }
  // Trains `r` on `group`; its rank 0 compares the measured peaks with the plan.
  static void check(const PlannedRun& r, const distributed::ProcessGroup& group) {
    const train::JobConfig c = config(r);
    train_on(c, group);
    if (group.rank() != 0) return;
    std::map<std::string, double> peak;
    std::ifstream f(c.job.dump_folder + "/metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      const auto j = nlohmann::json::parse(line);
      if (j["kind"] != "train") continue;
      for (const auto& [k, v] : j["peak_memory_bytes"].items()) peak[k] = std::max(peak[k], v.get<double>());
    }
    // The metrics give each category's largest peak over the ranks: so does the plan, over the
    // pipeline ranks (one without PP).
    const train::MemoryPlan plan = train::plan_memory(c, group.size(), 260, r.name);
    train::PlanCategories largest;
    // What FSDP's timing may or may not have alive at the peak: half of the two units' unsharded
    // gradients the plan counts, and the reduce-scatter receive buffers.
    std::map<std::string, double> timing;
    for (const train::MemoryPlan::Rank& pr : plan.pipeline_ranks) {
      for (double train::PlanCategories::*cat : {&train::PlanCategories::parameters, &train::PlanCategories::gradients,
                                                  &train::PlanCategories::optimizer, &train::PlanCategories::activations,
                                                  &train::PlanCategories::temporaries})
        largest.*cat = std::max(largest.*cat, pr.peak.*cat);
      for (const auto& [what, bytes] : pr.terms) {
        if (what.starts_with("gradients: unsharded")) timing["grads"] = std::max(timing["grads"], bytes / 2);
        if (what.starts_with("temporaries: ") && what.find("reduce-scatter receive buffers") != std::string::npos)
          timing["temp"] = std::max(timing["temp"], bytes);
        // A save's staging buffer lives while its writer runs: counted in a step's peak only when
        // the writer overlaps it (an async save's) or the save falls in its window.
        if (what.starts_with("temporaries: checkpoint staging") || what.starts_with("temporaries: async checkpoint"))
          timing["temp"] += bytes;
      }
    }
    const std::pair<const char*, double> cats[] = {{"params", largest.parameters},
                                                   {"grads", largest.gradients},
                                                   {"optim", largest.optimizer},
                                                   {"activations", largest.activations},
                                                   {"temp", largest.temporaries}};
    // The GEMM library's scratchpads are temporaries the plan does not count: oneDNN sizes them by the
    // implementation it picks for the CPU (none on AVX2 here, ~0.5 MiB with AVX-512's brgemm).
    std::map<std::string, double> unplanned;
    unplanned["temp"] = double(kernels::onednn::matmul_cache_stats().scratchpad_bytes);
    for (const auto& [key, planned] : cats) {
      const std::string what = r.name + " " + key + ": planned " + std::to_string(planned) + ", measured " +
                               std::to_string(peak.at(key));
      EXPECT_LE(peak.at(key), 1.1 * planned + unplanned[key]) << what;
      EXPECT_GE(peak.at(key), 0.9 * (planned - timing[key])) << what;
    }
    std::printf("plan / measured, %s: parameters %.3f, gradients %.3f, optimizer %.3f, activations %.3f, temporaries %.3f "
                "(%.0f KiB of GEMM scratchpads unplanned)\n",
                r.name.c_str(), largest.parameters / peak.at("params"), largest.gradients / peak.at("grads"),
                largest.optimizer / peak.at("optim"), largest.activations / peak.at("activations"),
                largest.temporaries / peak.at("temp"), unplanned["temp"] / 1024);
  }
  // The world split into groups of `size` consecutive ranks; each runs runs[its index].
  static void side_by_side(int size, const std::vector<PlannedRun>& runs) {
    const int color = world().rank() / size;
    std::unique_ptr<distributed::ProcessGroup> g =
        distributed::CommEngine::get().split(world(), color, world().rank(), "plan_group_" + std::to_string(size));
    check(runs.at(size_t(color)), *g);
    world().barrier().wait();
  }
};

}  // namespace

TEST_F(PlanMeasured, SixteenRunsWithinTenPercent) {
  if (world().size() != 4) GTEST_SKIP() << "4 ranks";
  check({"fsdp4", "llama3", {"--parallelism.data_parallel_shard_degree=4"}}, world());
  side_by_side(2, {{"tp2", "llama3", {"--parallelism.tensor_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"}},
                   {"cp2", "llama3", {"--parallelism.context_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1"}}});
  side_by_side(2, {{"pp2", "llama3",
                    {"--parallelism.pipeline_parallel_degree=2", "--parallelism.data_parallel_shard_degree=1",
                     "--training.local_batch_size=4", "--parallelism.pipeline_parallel_microbatch_size=1"}},
                   {"ep2", "deepseek_v32", {"--parallelism.data_parallel_shard_degree=2", "--parallelism.expert_parallel_degree=2"}}});
  // PP 2 x FSDP 2 as ZeRO-3 (fsdp.h's zero3, the default): each micro-batch's gradients
  // reduce-scattered once its weight gradient is done, the units gathered per use.
  for (const char* schedule : {"1F1B", "ZBVZeroBubble", "DualPipeV"})
    check({std::string("pp2_fsdp2_") + schedule, "llama3",
           {"--parallelism.pipeline_parallel_degree=2", "--parallelism.data_parallel_shard_degree=2",
            std::string("--parallelism.pipeline_parallel_schedule=") + schedule, "--training.local_batch_size=4",
            "--parallelism.pipeline_parallel_microbatch_size=1"}},
          world());
  for (const char* schedule : {"1F1B", "DualPipeV"})
    check({std::string("pp2_fsdp2_ep2_") + schedule, "deepseek_v32",
           {"--parallelism.pipeline_parallel_degree=2", "--parallelism.data_parallel_shard_degree=2",
            "--parallelism.expert_parallel_degree=2", std::string("--parallelism.pipeline_parallel_schedule=") + schedule,
            "--training.local_batch_size=4", "--parallelism.pipeline_parallel_microbatch_size=1"}},
          world());
  side_by_side(1, {{"one_llama3", "llama3", {}},
                   {"one_deepseek_v32", "deepseek_v32", {}},
                   {"one_llama3_bf16_selective", "llama3",
                    {"--training.mixed_precision_param=bfloat16", "--activation_checkpoint.mode=selective"}},
                   {"one_deepseek_v32_bf16_full", "deepseek_v32",
                    {"--training.mixed_precision_param=bfloat16", "--activation_checkpoint.mode=full"}}});
  // Saves every step through a 1 MiB staging buffer (the state is several MiB): an async one
  // under FSDP 2 with bf16 mixed precision (no bf16 copy kept: FSDP casts on the all-gather), and
  // a synchronous one with the swap optimizer (the moments streamed from the file).
  const std::vector<std::string> saves = {"--parallelism.data_parallel_shard_degree=2", "--checkpoint.enable=true",
                                          "--checkpoint.interval=1", "--checkpoint.staging_mib=1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), saves.begin(), saves.end());
    return extra;
  };
  side_by_side(2, {{"fsdp2_bf16_async_save", "llama3",
                    with({"--checkpoint.async_mode=async", "--training.mixed_precision_param=bfloat16"})},
                   {"fsdp2_swap_save", "llama3",
                    with({"--optimizer.swap=file", "--optimizer.swap_chunk_mb=1",
                          "--optimizer.swap_path=" + (root() / "fsdp2_swap_save" / "swap").string()})}});
}
