// The memory planner without running anything: its parameter inventory is the built models'
// parameters (names and shapes, TP layouts included), its counts are the flavors' analytic ones,
// and it reproduces the seed's 671B arithmetic (torchtitan-npu's write-up: f32 weights + gradients
// of 671B parameters = 5,368 GB; PP 2 x TP 4 leaves ~18 GB of non-expert weights + gradients per
// card before FSDP). Its figures against measured runs: distributed/memory_plan_measured_test.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "common/error_of.h"
#include "titan/core/allocator.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/llama3/args.h"
#include "titan/optim/muon_adamw.h"
#include "titan/train/memory_plan.h"

using namespace titan;

namespace {

std::map<std::string, Shape> planned(const train::ModelShape& m) {
  std::map<std::string, Shape> out;
  for (const train::PlannedParam& p : m.params) out[p.name] = p.shape;
  return out;
}

// The planned parameter `n` of `m` (a failure, and an empty one, if it is not planned).
train::PlannedParam find(const train::ModelShape& m, const std::string& n) {
  for (const train::PlannedParam& p : m.params)
    if (p.name == n) return p;
  ADD_FAILURE() << n << " is not planned";
  return train::PlannedParam{};
}

train::JobConfig config(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return train::parse_config(toml, "plan.toml", overrides);
}

const char* k671B = R"(
[model]
name = "deepseek_v3"
flavor = "671B"
[training]
local_batch_size = 4
seq_len = 4096
mixed_precision_param = "bfloat16"
[parallelism]
tensor_parallel_degree = 4
pipeline_parallel_degree = 2
pipeline_parallel_microbatch_size = 1
expert_parallel_degree = 32
[activation_checkpoint]
mode = "full"
)";

// A debug model at PP 2: 4 micro-batches of 1 x 256 tokens.
std::string pipeline_toml(const std::string& model) {
  return "[model]\nname = \"" + model +
         "\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 4\nseq_len = 256\n[parallelism]\n"
         "pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 1\n";
}

}  // namespace

// The planner's model is the family's, built without storage: the same parameters as a real
// build, none of their memory (671B in a few MiB: RoPE tables and routing buffers).
TEST(ParamInventory, IsTheModelBuiltWithoutStorage) {
  for (const auto& [name, mtp] : {std::pair{"llama3", 0}, std::pair{"deepseek_v3", 1}, std::pair{"deepseek_v32", 0},
                                  std::pair{"deepseek_v4", 1}}) {
    models::ModelOptions o;
    o.mtp_layers = mtp;
    const auto model = models::build_model(name, "debugmodel", 2048, 64, o);
    std::map<std::string, Shape> built;
    for (const auto& [n, p] : model->named_parameters()) built[n] = p->var.shape();
    EXPECT_EQ(planned(train::model_shape(name, "debugmodel", 2048, 64, mtp)), built) << name;
  }
  const int64_t before = memory_stats().live[size_t(MemCategory::parameters)];
  const train::ModelShape big = train::model_shape("deepseek_v32", "671B", 0, 4096);
  EXPECT_EQ(memory_stats().live[size_t(MemCategory::parameters)], before) << "the planner's model is freed";
  EXPECT_GT(big.params.size(), 1000u);
  EXPECT_GT(big.buffer_bytes, 0);
  EXPECT_LT(big.buffer_bytes, 64.0 * (1 << 20)) << "parameters were allocated";
}

// What the planner divides is what each model's parallel plan declares (Parameter::tp_plan).
TEST(ParamInventory, ReadsTheDeclaredParallelPlan) {
  const train::ModelShape llama = train::model_shape("llama3", "debugmodel", 2048);
  EXPECT_EQ(find(llama, "tok_embeddings.weight").tp_dim, 0);
  EXPECT_EQ(find(llama, "tok_embeddings.weight").layer, train::PlannedParam::kEmbedding);
  EXPECT_EQ(find(llama, "layers.2.attention.wq.weight").tp_dim, 0);
  EXPECT_EQ(find(llama, "layers.2.attention.wq.weight").layer, 2);
  EXPECT_EQ(find(llama, "layers.2.feed_forward.w2.weight").tp_dim, 1);
  EXPECT_EQ(find(llama, "layers.2.ffn_norm.weight").tp_dim, -1);
  EXPECT_TRUE(find(llama, "layers.2.ffn_norm.weight").tp_partial_grad);
  EXPECT_EQ(find(llama, "norm.weight").layer, train::PlannedParam::kHead);
  const train::ModelShape v32 = train::model_shape("deepseek_v32", "debugmodel", 2048);
  const train::PlannedParam indexer = find(v32, "layers.1.attention.indexer.wk.weight");
  EXPECT_EQ(indexer.tp_dim, -1);
  EXPECT_FALSE(indexer.tp_partial_grad) << "the indexer is computed whole on every TP rank";
  const train::PlannedParam experts = find(v32, "layers.1.moe.experts.w2");
  EXPECT_TRUE(experts.routed_expert);
  EXPECT_TRUE(experts.gemm);
  EXPECT_EQ(experts.tp_dim, -1) << "the MoE TP fix: whole experts";
  EXPECT_FALSE(find(v32, "layers.1.moe.router.gate.weight").gemm);
  const train::ModelShape gather = train::model_shape("deepseek_v32", "debugmodel", 2048, 0, 0, /*moe_tp_gather=*/true);
  EXPECT_EQ(find(gather, "layers.1.moe.experts.w2").tp_dim, 2) << "TorchTitan's scheme: hidden units split";
  EXPECT_EQ(find(gather, "layers.1.moe.experts.w1").tp_dim, 1);
  const train::ModelShape mtp = train::model_shape("deepseek_v3", "debugmodel", 2048, 0, 1);
  EXPECT_EQ(find(mtp, "mtp.0.eh_proj.weight").layer, train::PlannedParam::kMtp);
}

// DeepSeek-V4 under TP 2 (models/deepseek_v4/parallelize.cpp), measured from the declared plan
// and the planner's activation model, and printed (docs/deepseek_v4.md quotes them): which
// parameters are split (q_b_proj, sinks, o_a_proj / o_b_proj by groups, the shared expert,
// embedding and head) and which replicated (the mHC maps, norms, q_a_proj, kv_proj, compressors,
// indexers, the router; the routed experts under the MoE TP fix), and the activation bytes per
// token of one block that TP 2 halves (s) and leaves whole (r): held(1) = r + s, held(2) = r + s / 2.
TEST(ParamInventory, DeepSeekV4TensorParallelSplitAndReplicated) {
  const train::ModelShape debug = train::model_shape("deepseek_v4", "debugmodel", 2048);
  EXPECT_EQ(find(debug, "layers.2.self_attn.q_b_proj.weight").tp_dim, 0);
  EXPECT_EQ(find(debug, "layers.2.self_attn.sinks").tp_dim, 0);
  EXPECT_EQ(find(debug, "layers.2.self_attn.o_a_proj.weight").tp_dim, 0);
  EXPECT_EQ(find(debug, "layers.2.self_attn.o_b_proj.weight").tp_dim, 1);
  EXPECT_TRUE(find(debug, "layers.2.self_attn.kv_proj.weight").tp_partial_grad);
  EXPECT_TRUE(find(debug, "layers.2.attn_hc.fn").tp_partial_grad);
  const train::PlannedParam indexer = find(debug, "layers.1.self_attn.compressor.indexer.q_b_proj.weight");
  EXPECT_EQ(indexer.tp_dim, -1);
  EXPECT_FALSE(indexer.tp_partial_grad) << "the indexer is computed whole on every TP rank";
  for (const bool gather : {false, true}) {
    const train::ModelShape m = train::model_shape("deepseek_v4", "flash", 0, 0, 0, gather);
    double split = 0, replicated = 0, experts = 0;
    for (const train::PlannedParam& p : m.params) {
      const double n = double(p.shape.numel());
      (p.tp_dim >= 0 ? split : replicated) += n;
      if (p.routed_expert && p.tp_dim < 0) experts += n;
    }
    models::PlanQuery q{.flavor = "flash", .vocab = 0, .seq_len = 4096};
    q.moe_tp_gather = gather;
    const models::ActivationModel one = m.family->activations(q);
    q.tp = 2;
    const models::ActivationModel two = m.family->activations(q);
    const double s = 2 * (one.blocks[2].held - two.blocks[2].held), r = one.blocks[2].held - s;
    std::printf("deepseek_v4 flash, TP 2, moe_tp_scheme = %s: parameters split %.3fB, replicated %.3fB (routed "
                "experts %.3fB of them), per rank %.3fB of %.3fB; a CSA block's held activations per token: split "
                "%.0f bytes, replicated %.0f bytes (%.0f -> %.0f per rank)\n",
                gather ? "gather" : "sequence", split / 1e9, replicated / 1e9, experts / 1e9,
                (split / 2 + replicated) / 1e9, (split + replicated) / 1e9, s, r, one.blocks[2].held, two.blocks[2].held);
    EXPECT_GT(split, 0);
    EXPECT_GT(s, 0);
    EXPECT_GT(r, 0) << "the gathered input, query latent, key = value row and compressor are replicated";
    EXPECT_EQ(experts > 0, !gather) << "the MoE TP fix replicates the routed experts over TP";
  }
}

// The counts are the flavors' analytic ones (DeepSeek's 671B excludes its MTP module).
TEST(ParamInventory, CountsMatchTheFlavors) {
  for (const std::string flavor : {"16B", "671B"}) {
    const auto a = models::deepseek_v3::deepseek_v3_flavor(flavor);
    double n = 0;
    for (const auto& p : train::model_shape("deepseek_v3", flavor, 0).params) n += double(p.shape.numel());
    EXPECT_EQ(n, double(a.parameters().total)) << flavor;
  }
  const auto l8 = models::llama3::llama3_flavor("8B");
  double n = 0;
  for (const auto& p : train::model_shape("llama3", "8B", 0).params) n += double(p.shape.numel());
  EXPECT_EQ(n, double(l8.num_parameters()));
}

// The seed's figures: 671B parameters, 5,368 GB of f32 weights + gradients (more than 32 cards of
// 128 GB hold), ~18 GB of non-expert weights + gradients per card under PP 2 x TP 4.
TEST(MemoryPlan, ReproducesTheSeeds671BArithmetic) {
  const train::MemoryPlan p = train::plan_memory(config(k671B), 64, 0, "671B");
  EXPECT_EQ(p.mesh.dp_shard, 8);
  EXPECT_NEAR(p.total_params / 1e9, 671.0, 0.5);
  EXPECT_NEAR(p.total_params * 8 / 1e9, 5368, 5);
  EXPECT_GT(p.total_params * 8, 32 * 128e9) << "more than 32 cards of 128 GB";
  EXPECT_NEAR(p.non_expert_weights_grads_before_fsdp / 1e9, 18, 1.8);
  // DeepSeek-V3.2 adds the lightning indexers (0.85B, replicated over TP).
  const train::MemoryPlan v32 = train::plan_memory(config(k671B, {"--model.name=deepseek_v32"}), 64, 0, "671B");
  EXPECT_NEAR((v32.total_params - p.total_params) / 1e9, 0.85, 0.01);
  EXPECT_NEAR((v32.non_expert_weights_grads_before_fsdp - v32.tp_whole_weights_grads_before_fsdp) / 1e9,
              p.non_expert_weights_grads_before_fsdp / 1e9, 0.01);
  // Each rank of a stage holds 256 / 32 routed experts of its 29-31 MoE layers, FSDP-sharded over
  // the 8 ranks holding the same ones: about 1/64 of the experts' f32 weights in master shards.
  EXPECT_NEAR(p.expert_params / p.total_params, 0.974, 0.001);
}

TEST(MemoryPlan, SwapMovesTheMomentsToDisk) {
  const std::string toml = std::string(k671B) + "[optimizer]\nswap = \"file\"\nswap_chunk_mb = 128\n";
  const train::MemoryPlan resident = train::plan_memory(config(k671B), 64, 0, "671B");
  const train::MemoryPlan swapped = train::plan_memory(config(toml), 64, 0, "671B");
  EXPECT_EQ(swapped.peak.optimizer, 2.0 * (128 * (1 << 20) + 4096)) << "two chunk buffers and their page alignment";
  EXPECT_EQ(swapped.swapped_bytes, resident.peak.optimizer);
  EXPECT_EQ(swapped.peak.parameters, resident.peak.parameters);
}

// A rank of v pipeline stages holds v stage micro-batches per micro-batch of its activations: the
// simulator's 5 stage micro-batches in flight under DualPipeV (PP 2, 4 micro-batches) are 2.5 of
// the rank's, ZB-V's 4 are 2, and both place the same stages on a rank (measured under DualPipeV on
// deepseek_v32 debug, PP 2 x FSDP 2 x EP 2: 301.9 MiB of activations against 300.4 planned).
TEST(MemoryPlan, VSchedulesCountHalfMicroBatchesInFlight) {
  const std::string toml = pipeline_toml("llama3");
  const auto activations = [&](const std::string& schedule, std::string& term) {
    const train::MemoryPlan p =
        train::plan_memory(config(toml, {"--parallelism.pipeline_parallel_schedule=" + schedule}), 2, 0, schedule);
    for (const auto& [what, bytes] : p.terms)
      if (what.starts_with("activations:")) term = what;
    return p.peak.activations;
  };
  std::string dualpipev_term, zbv_term;
  const double dualpipev = activations("DualPipeV", dualpipev_term), zbv = activations("ZBVZeroBubble", zbv_term);
  EXPECT_NE(dualpipev_term.find("x 2.5 micro-batches in flight"), std::string::npos) << dualpipev_term;
  EXPECT_NE(zbv_term.find("x 2 micro-batches in flight"), std::string::npos) << zbv_term;
  EXPECT_DOUBLE_EQ(dualpipev / zbv, 1.25);
}

// Under PP per step (pipeline_parallel_fsdp) the step's end issues every FSDP unit's
// reduce-scatter at once: the engine's receive buffers are the stage's unsharded gradients, less
// the routed experts' when EP leaves them no expert-FSDP group to reduce-scatter over (EP 2 of
// dp_shard 2).
TEST(MemoryPlan, PipelineReduceScattersEveryUnitAtTheStepsEnd) {
  const std::string toml = pipeline_toml("deepseek_v32");
  const auto terms = [&](int ep) {
    std::map<std::string, double> out;
    const train::MemoryPlan p =
        train::plan_memory(config(toml, {"--parallelism.data_parallel_shard_degree=2", "--parallelism.pipeline_parallel_fsdp=per_step",
                                         "--parallelism.expert_parallel_degree=" + std::to_string(ep)}),
                           4, 0, "pp");
    for (const auto& [what, bytes] : p.terms) out[what] += bytes;
    return out;
  };
  // Its backward's temporaries are over by then: the category is the larger of the two.
  const std::string buffers = "temporaries: every unit's reduce-scatter receive buffers at the step's end, beyond the backward's";
  const std::string backward = "temporaries: activation gradients (the loss's or a block's backward)";
  const std::string unsharded = "gradients: f32 unsharded gradients";
  auto no_ep = terms(1), ep = terms(2);
  ASSERT_GT(no_ep[buffers], 0);
  EXPECT_DOUBLE_EQ(no_ep[backward] + no_ep[buffers], no_ep[unsharded]);
  EXPECT_LT(ep[backward] + ep[buffers], ep[unsharded]);
  EXPECT_GT(ep[backward] + ep[buffers], 0.5 * ep[unsharded]);
}

// Under PP with FSDP's zero3 (the default) each micro-batch's unit gradients are reduce-scattered
// as without PP: two units unsharded, the shards summed (in place: once), one unit's receive
// buffers, two units gathered; per step holds every unit gathered and unsharded. The traffic:
// micro-batches x the reduce-scatter bytes, and the all-gathers per forward and backward.
TEST(MemoryPlan, PipelineFsdpZero3AgainstPerStep) {
  const std::string toml = pipeline_toml("llama3");
  const auto plan = [&](const std::string& mode) {
    return train::plan_memory(config(toml, {"--parallelism.data_parallel_shard_degree=2", "--training.local_batch_size=4",
                                            "--parallelism.pipeline_parallel_fsdp=" + mode}),
                              4, 0, "pp");
  };
  const train::MemoryPlan zero3 = plan("zero3"), per_step = plan("per_step");
  std::map<std::string, double> z, p;
  for (const auto& [what, bytes] : zero3.terms) z[what] += bytes;
  for (const auto& [what, bytes] : per_step.terms) p[what] += bytes;
  EXPECT_GT(z["gradients: unsharded, the unit in backward + the one reduce-scattering"], 0);
  EXPECT_GT(z["parameters: FSDP units gathered (running + prefetched)"], 0);
  EXPECT_GT(z["temporaries: a unit's reduce-scatter receive buffers"], 0);
  EXPECT_GT(p["parameters: every FSDP unit gathered"], z["parameters: FSDP units gathered (running + prefetched)"]);
  EXPECT_LT(zero3.peak.gradients, per_step.peak.gradients);
  EXPECT_LT(zero3.peak.parameters, per_step.peak.parameters);
  std::map<std::string, double> zt, pt;
  for (const auto& c : zero3.traffic) zt[c.group + " " + c.op] += c.bytes;
  for (const auto& c : per_step.traffic) pt[c.group + " " + c.op] += c.bytes;
  EXPECT_DOUBLE_EQ(zt["fsdp reduce_scatter"], 4 * pt["fsdp reduce_scatter"]);  // 4 micro-batches
  EXPECT_GT(zt["fsdp all_gather"], 4 * pt["fsdp all_gather"]);
}

// DeepSeek-V4's stages pass its residual streams: the pipeline's traffic and buffers are hc_mult x
// dim values per token (the blocks', TP's and EP's rows stay dim wide), and its embedding
// (transformers' name, embed_tokens) is the first stage's.
TEST(MemoryPlan, DeepSeekV4StagesPassTheResidualStreams) {
  const train::ModelShape v4 = train::model_shape("deepseek_v4", "debugmodel", 2048);
  EXPECT_EQ(v4.dim, 128);
  EXPECT_EQ(v4.stage_width, 4 * 128) << "hc_mult streams of dim";
  int embedding = 0;
  for (const train::PlannedParam& p : v4.params)
    if (p.name == "embed_tokens.weight") embedding = p.layer;
  EXPECT_EQ(embedding, train::PlannedParam::kEmbedding);
  const train::MemoryPlan p = train::plan_memory(
      config(pipeline_toml("deepseek_v4"), {"--training.mixed_precision_param=float32"}), 2, 2048, "pp");
  double sent = -1;
  for (const auto& c : p.traffic)
    if (c.group == "pp" && c.op == "send") sent = c.bytes;
  // 4 micro-batches of 256 tokens, each one's streams forward and their gradient back, f32.
  EXPECT_DOUBLE_EQ(sent, 2.0 * 4 * 256 * (4 * 128) * 4);
}

// The communication terms scale as the plans say: FSDP's all-gather with (n - 1) / n of the
// parameters, TP's activations with the layers, EP's all-to-all with the routed rows.
TEST(MemoryPlan, TrafficFollowsTheAnalyticMinimum) {
  const std::string llama = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\nseq_len = 256\n"
                            "mixed_precision_param = \"float32\"\n";
  auto bytes = [](const train::MemoryPlan& p, const std::string& group, const std::string& op) {
    for (const auto& c : p.traffic)
      if (c.group == group && c.op == op) return c.bytes;
    return -1.0;
  };
  const train::MemoryPlan f2 = train::plan_memory(config(llama), 2, 2048, "x");
  const train::MemoryPlan f4 = train::plan_memory(config(llama), 4, 2048, "x");
  const double params = f2.total_params * 4;
  // Every unit gathered twice (forward, backward) but the output head (kept) and the root (once).
  EXPECT_GT(bytes(f2, "fsdp", "all_gather"), 1.5 * params * 0.5);
  EXPECT_LT(bytes(f2, "fsdp", "all_gather"), 2.0 * params * 0.5);
  EXPECT_NEAR(bytes(f2, "fsdp", "reduce_scatter"), params * 0.5, 1e-6 * params);
  EXPECT_NEAR(bytes(f4, "fsdp", "reduce_scatter"), params * 0.75, 1e-6 * params);
  EXPECT_EQ(bytes(f2, "tp", "all_gather"), -1.0);
  const train::MemoryPlan tp = train::plan_memory(config(llama, {"--parallelism.tensor_parallel_degree=2"}), 2, 2048, "x");
  // 2 x (2 layers x 6 + 1) all-gathers of half of 512 tokens x 256 wide f32 activations.
  EXPECT_DOUBLE_EQ(bytes(tp, "tp", "all_gather"), 2 * 13 * 0.5 * 512 * 256 * 4);
  // deepseek_v3 at TP 2, a quarter of the experts per rank: the MoE TP fix with EP 4 (each TP rank
  // dispatches its own half of the tokens) sends 3/4 x 1/2 of the all-to-all rows that TorchTitan's
  // scheme with EP 2 does (every TP rank dispatching all of them, half of them away).
  const std::string ds = "[model]\nname = \"deepseek_v3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\n"
                         "seq_len = 256\nmixed_precision_param = \"float32\"\n[parallelism]\ntensor_parallel_degree = 2\n"
                         "data_parallel_shard_degree = 2\n";
  const train::MemoryPlan fix = train::plan_memory(
      config(ds, {"--parallelism.expert_parallel_degree=4"}), 4, 2048, "x");
  const train::MemoryPlan etp = train::plan_memory(
      config(ds, {"--parallelism.expert_parallel_degree=2", "--parallelism.moe_tp_scheme=gather"}), 4, 2048, "x");
  EXPECT_DOUBLE_EQ(bytes(fix, "ep", "all_to_all") / bytes(etp, "ep", "all_to_all"), 0.75);
  EXPECT_EQ(fix.mesh.efsdp(), 1);
  EXPECT_EQ(etp.mesh.efsdp(), 1);
  // ... and the smallest world under the gather scheme skips a dp_shard that EP cannot borrow from.
  EXPECT_EQ(train::smallest_world(config(ds, {"--parallelism.expert_parallel_degree=2", "--parallelism.moe_tp_scheme=gather",
                                              "--parallelism.data_parallel_shard_degree=-1"}),
                                  2048, 1e12, "x"),
            4);
}

// A mesh that does not divide the world fails as the trainer does, naming the keys.
TEST(MemoryPlan, AMeshThatDoesNotDivideTheWorldIsAClearError) {
  const std::string toml = "[model]\nname = \"llama3\"\n[parallelism]\ntensor_parallel_degree = 4\n";
  const std::string e = test::error_of([&] { train::plan_memory(config(toml), 6, 2048, "job.toml"); });
  EXPECT_NE(e.find("job.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor_parallel_degree"), std::string::npos) << e;
}

// The smallest world whose busiest rank fits: FSDP's shards shrink as dp_shard grows (in steps
// that keep EP 32 dividing dp_shard x tp).
TEST(MemoryPlan, SmallestWorldFitsAndOneLessDoesNot) {
  const train::JobConfig c = config(k671B, {"--parallelism.pipeline_parallel_degree=1", "--training.local_batch_size=1"});
  const double device = 64.0 * (int64_t(1) << 30);
  const int world = train::smallest_world(c, 0, device, "671B");
  ASSERT_GT(world, 32);
  train::JobConfig at = c;
  at.parallelism.data_parallel_shard_degree = world / 4;
  EXPECT_LE(train::plan_memory(at, world, 0, "671B").peak.total(), device);
  at.parallelism.data_parallel_shard_degree = world / 4 - 8;
  EXPECT_GT(train::plan_memory(at, world - 32, 0, "671B").peak.total(), device);
  EXPECT_EQ(train::smallest_world(c, 0, 1e9, "671B", 1024), 0) << "1 GB holds no rank's share";
}

// Optimizer state under [optimizer] name = "Muon": one f32 buffer per Muon matrix, AdamW's two
// moments for the rest, plus the step's scratch; the plan's figure is what building the optimizer
// on the real model allocates, to the byte, and about half of AdamW's.
TEST(MemoryPlan, MuonStateIsOneBufferPerMatrixAsMeasured) {
  const std::string toml = "[model]\nname = \"llama3\"\nflavor = \"debugmodel\"\n[training]\nlocal_batch_size = 2\n"
                           "seq_len = 64\nmixed_precision_param = \"float32\"\n";
  const train::MemoryPlan adamw = train::plan_memory(config(toml), 1, 2048, "plan.toml");
  const train::MemoryPlan muon = train::plan_memory(config(toml, {"--optimizer.name=Muon"}), 1, 2048, "plan.toml");
  EXPECT_EQ(adamw.peak.optimizer, 8 * adamw.total_params);
  double muon_params = 0;
  for (const train::PlannedParam& p : muon.model.params) muon_params += p.muon ? double(p.shape.numel()) : 0;
  EXPECT_GT(muon_params, 0.5 * muon.total_params) << "the debug model's matrices (its vocabulary matrices are large)";
  EXPECT_EQ(adamw.peak.parameters, muon.peak.parameters);
  double buffers = 0, scratch = 0;
  for (const auto& [what, bytes] : muon.terms) {
    if (what == "optimizer: Muon momentum buffers (f32)") buffers = bytes;
    if (what.starts_with("optimizer: Muon update matrix")) scratch = bytes;
  }
  EXPECT_EQ(buffers, 4 * muon_params);
  EXPECT_GT(scratch, 0);
  EXPECT_EQ(muon.peak.optimizer, adamw.peak.optimizer - 4 * muon_params + scratch);

  const auto model = models::build_model("llama3", "debugmodel", 2048, 64, models::ModelOptions{});
  const int64_t before = memory_stats().live[size_t(MemCategory::optimizer_state)];
  const optim::MuonAdamW opt(optim::split_muon_groups(nn::trainable_params(model->named_parameters()),
                                                      model->named_parameters()),
                             optim::MuonConfig{}, 1.0, kernels::AdamWParams{});
  EXPECT_EQ(muon.peak.optimizer, double(memory_stats().live[size_t(MemCategory::optimizer_state)] - before));

  // Swapped: the state on disk is the same bytes, and only chunk buffers stay in memory.
  const train::MemoryPlan swapped =
      train::plan_memory(config(toml, {"--optimizer.name=Muon", "--optimizer.swap=file", "--optimizer.swap_chunk_mb=1"}),
                         1, 2048, "plan.toml");
  EXPECT_EQ(swapped.swapped_bytes + scratch, muon.peak.optimizer);
  EXPECT_LT(swapped.peak.optimizer, muon.peak.optimizer);

  // FSDP 4: the momentum divides by 4; the exchange buffers are this rank's rows of every matrix
  // plus the matrices it owns, whole; the all-to-alls send 2 x 3/4 of the matrices over the group.
  const train::MemoryPlan fsdp = train::plan_memory(
      config(toml, {"--optimizer.name=Muon", "--parallelism.data_parallel_shard_degree=4"}), 4, 2048, "plan.toml");
  double fsdp_buffers = 0, exchange = 0, all_to_all = 0;
  for (const auto& [what, bytes] : fsdp.terms) {
    if (what == "optimizer: Muon momentum buffers (f32)") fsdp_buffers = bytes;
    if (what.starts_with("optimizer: Muon under FSDP")) exchange = bytes;
  }
  for (const train::PlanCollective& t : fsdp.traffic)
    if (t.op == "all_to_all") all_to_all = t.bytes;
  EXPECT_EQ(fsdp_buffers, buffers / 4) << "llama3 debug's matrices have rows divisible by 4";
  EXPECT_GE(exchange, buffers / 4 + buffers / 4) << "at least its rows and a quarter of the matrices";
  EXPECT_LT(exchange, buffers / 4 + buffers / 2);
  EXPECT_EQ(all_to_all, 2 * 0.75 * muon_params * 4 / 4);

  // TP 2 x FSDP 2: every matrix is tensor-parallel, gathered over the 4 ranks of dp_shard x tp:
  // the same buffers and traffic as FSDP 4, on the TP group's exchange and none on FSDP's.
  const train::MemoryPlan tp = train::plan_memory(config(toml, {"--optimizer.name=Muon",
                                                                "--parallelism.data_parallel_shard_degree=2",
                                                                "--parallelism.tensor_parallel_degree=2"}),
                                                  4, 2048, "plan.toml");
  double tp_exchange = 0, fsdp_exchange = 0, tp_all_to_all = 0, fsdp_all_to_all = 0;
  for (const auto& [what, bytes] : tp.terms) {
    if (what.starts_with("optimizer: Muon under TP")) tp_exchange = bytes;
    if (what.starts_with("optimizer: Muon under FSDP")) fsdp_exchange = bytes;
  }
  for (const train::PlanCollective& t : tp.traffic)
    if (t.op == "all_to_all") (t.group == "fsdp x tp" ? tp_all_to_all : fsdp_all_to_all) += t.bytes;
  EXPECT_EQ(tp_exchange, exchange);
  EXPECT_EQ(fsdp_exchange, 0);
  EXPECT_EQ(tp_all_to_all, all_to_all);
  EXPECT_EQ(fsdp_all_to_all, 0);
}
