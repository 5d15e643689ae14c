// Pipeline parallelism composed with FSDP, TP, EP, CP and DDP on 4 ranks (DeepSeek-V4: FSDP).
#include "distributed/pipeline_common.h"

#include <array>
#include <map>

#include "titan/distributed/comm_engine.h"
#include "titan/distributed/pipeline_executor.h"

using namespace titan;
using namespace titan::test;

namespace {

// 260 byte-level tokens: a vocabulary TP 2 divides.
class PipelineComposition : public PipelineSuite<PipelineComposition, 260> {
 public:
  static constexpr const char* kTag = "pipeline_composition";
};

// PP 2 x FSDP 2 and PP 2 x TP 2, on 4 ranks: the schedules with the full backward and the split
// one. FSDP's default under PP, zero3 (fsdp.h), reduce-scatters each micro-batch's gradients of a
// unit once its weight gradient is done (under ZB-V and DualPipeV after the deferred W) and
// gathers the units for each forward and backward: with the tree sum the same bits as one rank
// (each data-parallel rank takes every other micro-batch of the batch), in place to rounding. The
// old way, per_step (gradients unsharded through the step, one reduce-scatter after the last W,
// units gathered from first use), against it: micro-batches (4) x fewer reduce-scatter bytes,
// fewer all-gather bytes, more gradient and parameter memory. A zero3 checkpoint (DualPipeV's
// step 10) resumes under 1F1B with the run's losses, bit for bit.
TEST_F(PipelineComposition, ComposesWithFsdpAndTensorParallel) {
  if (world().size() != 4) GTEST_SKIP() << "PP 2 x FSDP 2 and PP 2 x TP 2 on 4 ranks";
  const int64_t batch = 8, microbatches = 4;  // per data-parallel rank
  const auto one = reference_on_rank0(config("llama3", "reference_fsdp", 1, 1, "1F1B", batch, {}, 1));
  auto& engine = distributed::CommEngine::get();
  for (const std::string schedule : {"1F1B", "ZBVZeroBubble", "DualPipeV"}) {
    std::map<std::string, std::array<int64_t, 2>> bytes;  // run -> all-gather, reduce-scatter bytes sent
    std::map<std::string, nlohmann::json> peak;            // run -> the last step's peak memory by category
    const auto run = [&](const std::string& what, const std::vector<std::string>& extra, double tolerance) {
      engine.reset_stats();
      const std::string name = schedule + "_fsdp_" + what;
      const auto got = train_on(config("llama3", name, 2, 1, schedule, batch, extra, 0, 2), world());
      expect_same_losses(one, got, tolerance, "PP 2 x FSDP 2, " + schedule + ", " + what);
      std::ifstream metrics(root() / ("llama3_" + name) / "metrics.jsonl");
      for (std::string line; std::getline(metrics, line);)
        if (const auto j = nlohmann::json::parse(line); j.contains("peak_memory_bytes")) peak[what] = j["peak_memory_bytes"];
      for (const auto& [key, st] : engine.stats()) {
        if (key.second == distributed::CommOp::all_gather) bytes[what][0] += st.bytes;
        if (key.second == distributed::CommOp::reduce_scatter) bytes[what][1] += st.bytes;
      }
    };
    const std::vector<std::string> save = {"--checkpoint.enable=true", "--checkpoint.interval=10",
                                           "--checkpoint.keep_latest_k=0", "--checkpoint.last_save_model_only=false"};
    run("zero3", schedule == "DualPipeV" ? save : std::vector<std::string>{}, 0);
    run("zero3_in_place", {"--parallelism.pipeline_parallel_gradient_sum=in_place"}, 1e-5);
    run("per_step", {"--parallelism.pipeline_parallel_fsdp=per_step"}, 0);
    EXPECT_EQ(bytes["zero3"][1], microbatches * bytes["per_step"][1]) << schedule;
    EXPECT_EQ(bytes["zero3_in_place"][1], bytes["zero3"][1]) << schedule;
    EXPECT_GT(bytes["zero3"][0], 2 * bytes["per_step"][0]) << schedule;
    EXPECT_LT(peak["zero3"].value("grads", 0), peak["per_step"].value("grads", 0)) << schedule;
    EXPECT_LT(peak["zero3"].value("params", 0), peak["per_step"].value("params", 0)) << schedule;
    EXPECT_LE(peak["zero3_in_place"].value("grads", 0), peak["zero3"].value("grads", 0)) << schedule;
    for (const std::string what : {"zero3", "zero3_in_place", "per_step"})
      std::printf("PP 2 x FSDP 2, %s, %s: peak (largest rank) %.3f MB: parameters %.3f, gradients %.3f; "
                  "all-gather %lld bytes, reduce-scatter %lld\n",
                  schedule.c_str(), what.c_str(), peak[what].value("total", 0) / 1e6, peak[what].value("params", 0) / 1e6,
                  peak[what].value("grads", 0) / 1e6, static_cast<long long>(bytes[what][0]),
                  static_cast<long long>(bytes[what][1]));
    const auto tp = train_on(config("llama3", schedule + "_tp", 2, 2, schedule, batch), world());
    expect_same_losses(one, tp, 1e-5, "PP 2 x TP 2, " + schedule);
  }
  const fs::path step10 = root() / "llama3_DualPipeV_fsdp_zero3" / "checkpoint" / "step-10";
  ASSERT_TRUE(fs::exists(step10)) << step10;
  const auto resumed = train_on(config("llama3", "fsdp_zero3_resumed", 2, 1, "1F1B", batch,
                                       {"--checkpoint.enable=true", "--checkpoint.initial_load_path=" + step10.string(),
                                        "--checkpoint.initial_load_model_only=false"},
                                       0, 2),
                                world());
  expect_same_losses(std::vector<double>(one.end() - 10, one.end()), resumed, 0,
                     "PP 2 x FSDP 2 zero3 resumed under 1F1B from DualPipeV's step 10");
}

// PP 2 x EP 2 for deepseek_v32 on 4 ranks: each stage's routed experts divided over the 2 ranks of
// its data-parallel group (all-to-all dispatch and combine inside every micro-batch's forward and
// backward, the dense parameters FSDP-sharded over the same 2), through the dense warm-up and the
// sparse stage, under DualPipeV (deferred weight gradients, and overlapped pairs run as compute
// pairs: the forward and the backward take turns at every all-to-all). The experts' weight
// gradients sum their rows in another order than one rank's GEMM (as every EP layout:
// expert_parallel_test.cpp), so the losses agree to 1e-5, not bit for bit. Taking turns changes
// no number: the same run with the pairs one action after the other gives the same bits.
TEST_F(PipelineComposition, DeepSeekV32WithExpertParallel) {
  if (world().size() != 4) GTEST_SKIP() << "PP 2 x EP 2 on 4 ranks";
  const int64_t batch = 8;  // 4 micro-batches per data-parallel rank: what DualPipeV needs at PP 2
  const std::vector<std::string> lr = {"--optimizer.lr=3e-4"};
  const auto one = reference_on_rank0(config("deepseek_v32", "reference_ep", 1, 1, "1F1B", batch, lr, 1));
  // The defaults a user gets: the in-place gradient sum (the losses are within 1e-5 either way).
  std::vector<std::string> extra = lr;
  extra.push_back("--parallelism.expert_parallel_degree=2");
  extra.push_back("--parallelism.pipeline_parallel_gradient_sum=in_place");
  auto& engine = distributed::CommEngine::get();
  engine.reset_stats();
  int handoffs = 0;
  const train::JobConfig paired = config("deepseek_v32", "dualpipev_ep", 2, 1, "DualPipeV", batch, extra, 0, 2);
  {
    train::Trainer t(paired, "test", &world());
    t.train();
    handoffs = t.pipeline_executor()->times().handoffs;
  }
  world().barrier().wait();
  const auto got = losses_of(paired.job.dump_folder);
  expect_same_losses(one, got, 1e-5, "PP 2 x EP 2, deepseek_v32, DualPipeV");
  int64_t exchanged = 0;  // the tokens' rows dispatched and combined between the EP ranks
  for (const auto& [key, st] : engine.stats())
    if (key.second == distributed::CommOp::all_to_allv) exchanged += st.bytes;
  EXPECT_GT(exchanged, 0) << "no expert all-to-all ran";
  // Every rank runs pairs (DualPipeV at PP 2, 4 micro-batches); each pair's pieces pass the turn at
  // their all-to-alls (3 per MoE layer forward, 2 backward).
  EXPECT_GT(handoffs, 0) << "the pairs never took turns on rank " << world().rank();
  extra.push_back("--parallelism.pipeline_parallel_expert_parallel_overlap=false");
  extra.push_back("--training.steps=5");  // the learning rate is the same as the 20 steps' through step 5's loss
  const auto sequential = train_on(config("deepseek_v32", "dualpipev_ep_sequential", 2, 1, "DualPipeV", batch, extra, 0, 2),
                                   world());
  expect_same_losses(std::vector<double>(got.begin(), got.begin() + 5), sequential, 0,
                     "PP 2 x EP 2, DualPipeV pairs one action after the other");
}

// DeepSeek-V4 under PP 2 x FSDP 2 on 4 ranks, DualPipeV: each stage's layers (and the embedding,
// the HyperHead and output head, both on the V's first rank) sharded over its 2 data-parallel
// ranks, the residual streams between the stages. One rank's losses and indexer KL.
TEST_F(PipelineComposition, DeepSeekV4WithFsdp) {
  if (world().size() != 4) GTEST_SKIP() << "PP 2 x FSDP 2 on 4 ranks";
  const int64_t batch = 8;  // 4 micro-batches per data-parallel rank: what DualPipeV needs at PP 2
  const auto one = reference_on_rank0(config("deepseek_v4", "reference_fsdp", 1, 1, "1F1B", batch, {}, 1));
  const auto one_kl = losses_of(root() / "deepseek_v4_reference_fsdp", "train", "indexer_loss");
  const auto got = train_on(config("deepseek_v4", "dualpipev_fsdp", 2, 1, "DualPipeV", batch, {}, 0, 2), world());
  expect_same_losses(one, got, 0, "PP 2 x FSDP 2, deepseek_v4, DualPipeV");
  expect_same_losses(one_kl, losses_of(root() / "deepseek_v4_dualpipev_fsdp", "train", "indexer_loss"), 1e-12,
                     "PP 2 x FSDP 2, deepseek_v4, DualPipeV, indexer loss");
}

// PP 2 x CP 2: every stage on the two ranks of its cp group, each running its head-tail chunks of
// every micro-batch (llama3: ring attention; deepseek_v32: DSA's all-gathered latent KV and indexer
// keys, through the dense warm-up and the sparse stage), the last stage averaging the loss over
// the group, the stage's gradients reduce-scattered over it (FSDP shards over dp_shard x cp).
// Ring attention merges the key blocks in another order than one rank's attention: 1e-5
// (measured: llama3 <= 1.5e-7, deepseek_v32 <= 3.2e-8 relative). The deepseek_v32 run at lr 1e-4:
// at 3e-4 (8 micro-batches) one routing choice flipped at step 8 under CP 2 alone as under PP 2 x
// CP 2 (the two runs agreeing to 1e-7 throughout) and the losses parted from one rank's by 1e-4
// by step 16.
TEST_F(PipelineComposition, ComposesWithContextParallel) {
  if (world().size() != 4) GTEST_SKIP() << "PP 2 x CP 2 on 4 ranks";
  const int64_t batch = 4;  // 4 micro-batches: what DualPipeV needs at PP 2
  const std::vector<std::string> cp = {"--parallelism.context_parallel_degree=2"};
  auto& engine = distributed::CommEngine::get();
  const auto cp_bytes = [&] {  // what the stages' cp groups exchanged (ring attention, DSA's all-gathers)
    int64_t bytes = 0;
    for (const auto& [key, st] : engine.stats())
      if (key.first == "cp") bytes += st.bytes;
    return bytes;
  };
  const auto one = reference_on_rank0(config("llama3", "reference_cp", 1, 1, "1F1B", batch, {}, 1));
  for (const std::string schedule : {"1F1B", "ZBVZeroBubble"}) {
    engine.reset_stats();
    expect_same_losses(one, train_on(config("llama3", schedule + "_cp", 2, 1, schedule, batch, cp), world()), 1e-5,
                       "PP 2 x CP 2, llama3, " + schedule);
    EXPECT_GT(cp_bytes(), 0) << schedule << ": the stages ran no context-parallel exchange";
  }
  const std::vector<std::string> dsa = {"--optimizer.lr=1e-4", "--model.converters=dsa_fused"};
  const auto one_ds = reference_on_rank0(config("deepseek_v32", "reference_cp", 1, 1, "1F1B", batch, dsa, 1));
  std::vector<std::string> extra = dsa;
  extra.insert(extra.end(), cp.begin(), cp.end());
  engine.reset_stats();
  expect_same_losses(one_ds, train_on(config("deepseek_v32", "dualpipev_cp", 2, 1, "DualPipeV", batch, extra), world()),
                     1e-5, "PP 2 x CP 2, deepseek_v32, DualPipeV");
  EXPECT_GT(cp_bytes(), 0) << "deepseek_v32: the stages ran no context-parallel exchange";
}

// PP 2 x DDP 2: the replicas all-reduce each stage's gradients once, after the step's last
// weight gradient (ddp.h), and reproduce one rank bit for bit with the tree sum, to rounding in place.
TEST_F(PipelineComposition, ComposesWithDdp) {
  if (world().size() != 4) GTEST_SKIP() << "PP 2 x DDP 2 on 4 ranks";
  const int64_t batch = 8;
  const auto one = reference_on_rank0(config("llama3", "reference_ddp", 1, 1, "1F1B", batch, {}, 1));
  for (const std::string schedule : {"1F1B", "DualPipeV"}) {
    auto& engine = distributed::CommEngine::get();
    engine.reset_stats();
    const auto got = train_on(config("llama3", schedule + "_ddp", 2, 1, schedule, batch,
                                     {"--parallelism.data_parallel_replicate_degree=2"}, batch / 2),
                              world());
    expect_same_losses(one, got, 0, "PP 2 x DDP 2, " + schedule);
    int64_t calls = 0;
    for (const auto& [key, st] : engine.stats())
      if (key.second == distributed::CommOp::all_reduce && key.first.find("dp_replicate") != std::string::npos) calls += st.calls;
    EXPECT_GT(calls, 0) << schedule << ": the replicas never all-reduced";
  }
  // The default in-place sum adds each micro-batch into the buckets' views directly.
  const auto in_place = train_on(config("llama3", "dualpipev_ddp_in_place", 2, 1, "DualPipeV", batch,
                                        {"--parallelism.data_parallel_replicate_degree=2",
                                         "--parallelism.pipeline_parallel_gradient_sum=in_place"},
                                        batch / 2),
                                 world());
  expect_same_losses(one, in_place, 1e-5, "PP 2 x DDP 2, DualPipeV, gradients summed in place");
}

}  // namespace
