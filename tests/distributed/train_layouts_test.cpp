// Every data-parallel layout reproduces the 1-rank run over 20 steps: DDP, FSDP, HSDP, FSDP with
// bf16 mixed precision, with gradient accumulation, with activation checkpointing, for the llama3
// and deepseek_v32 debug models (MoE with its balancing from global expert loads; DSA's dense
// warm-up, then its sparse stage). The reference runs on rank 0 alone with the same global batch
// as micro-batches of the same shape accumulated in order.
//
// They match to the last bit. Gradients are summed over ranks as a binary tree (the all-to-all +
// tree sum of process_group.h) and over micro-batches as the same tree (distributed/tree_sum.h),
// so with power-of-two counts every layout adds the same micro-batch gradients in the same
// order as the one rank does; each micro-batch computes the same numbers on any rank with the
// same thread count (every rank, the reference included, runs one thread); the gradient norm's
// squares are summed in double, where shards and whole tensors round to the same clip factor.
// The one exception, said where it is tested: DDP with gradient accumulation adds a rank's
// micro-batches in its gradient buckets before the ranks are summed.
#include "distributed/common.h"

using namespace titan;
using namespace titan::test;

namespace {

struct Case {
  std::string name;
  int64_t replicate = 1, shard = 1, local_batch = 2;
  std::vector<std::string> extra = {};  // more keys, as command-line overrides
};

// Every rank's all-gather traffic on the FSDP group since the last reset: bytes sent, calls.
std::pair<int64_t, int64_t> fsdp_all_gathers() {
  distributed::CommStats s;
  for (const auto& [key, st] : distributed::CommEngine::get().stats())
    if (key.first == "fsdp" && key.second == distributed::CommOp::all_gather) s = st;
  return {s.bytes, s.calls};
}

class Layouts : public TrainingSuite<Layouts> {
 public:
  static constexpr const char* kTag = "layouts";

 protected:
  // The config of `c` for `model`, 20 steps, global batch = 4 sequences (unless extra sets it).
  static train::JobConfig config(const std::string& model, const Case& c, int64_t global_batch = 4) {
    std::string toml = base_toml(model, data(), root() / (model + "_" + c.name), 20);
    toml += "[parallelism]\ndata_parallel_replicate_degree = " + std::to_string(c.replicate) +
            "\ndata_parallel_shard_degree = " + std::to_string(c.shard) + "\n";
    train::JobConfig cfg = train::parse_config(toml, c.name + ".toml", c.extra);
    cfg.training.local_batch_size = c.local_batch;
    cfg.training.global_batch_size = global_batch;
    return cfg;
  }
  // The 1-rank run with micro-batches of `local_batch` sequences accumulated to the global batch.
  static std::vector<double> reference(const std::string& model, const std::string& name, int64_t local_batch,
                                       const std::vector<std::string>& extra = {}) {
    return reference_on_rank0(config(model, {"reference_" + name, 1, 1, local_batch, extra}));
  }
  static std::vector<double> layout(const std::string& model, const Case& c) {
    return train_on(config(model, c), world());
  }
  // Every layout of this world size against the 1-rank run, to the last bit.
  static void check_layouts(const std::string& model) {
    const int n = world().size();
    if (n != 2 && n != 4) GTEST_SKIP() << "layouts of 2 and 4 ranks";
    const int64_t local = 4 / n;  // the global batch of 4 sequences over n ranks
    const std::string ranks = std::to_string(n);
    // Validation every 10 steps over 2 global batches of 4 sequences: each rank evaluates its
    // quarter or half of each batch, and the ranks' mean is the batch's (to rounding).
    const auto validation = [](int64_t per_rank) {
      return std::vector<std::string>{"--validation.enable=true", "--validation.freq=10", "--validation.steps=2",
                                      "--validation.seq_len=64", "--validation.local_batch_size=" + std::to_string(per_rank)};
    };
    const auto one = reference(model, "f32", local, validation(4));
    expect_same_losses(one, layout(model, {"fsdp", 1, n, local, validation(4 / n)}), 0, "FSDP " + ranks);
    expect_same_losses(losses_of(root() / (model + "_reference_f32"), "validation"),
                       losses_of(root() / (model + "_fsdp"), "validation"), 1e-6, "FSDP " + ranks + ", validation loss");
    expect_same_losses(one, layout(model, {"ddp", n, 1, local}), 0, "DDP " + ranks);
    if (n == 4) expect_same_losses(one, layout(model, {"hsdp", 2, 2, local}), 0, "HSDP 2 x 2");
    expect_same_losses(one, layout(model, {"fsdp_ac", 1, n, local, {"--activation_checkpoint.mode=full"}}), 0,
                       "FSDP " + ranks + ", full activation checkpointing");
    expect_same_losses(one,
                       layout(model, {"fsdp_always", 1, n, local,
                                      {"--activation_checkpoint.mode=selective",
                                       "--parallelism.fsdp_reshard_after_forward=always"}}),
                       0, "FSDP " + ranks + ", every unit resharded, selective activation checkpointing");
    expect_same_losses(one, layout(model, {"fsdp_never", 1, n, local, {"--parallelism.fsdp_reshard_after_forward=never"}}),
                       0, "FSDP " + ranks + ", nothing resharded after forward (ZeRO-2)");
    // bf16 mixed precision: GEMM weights gathered in bf16 from the f32 master shards.
    std::vector<std::string> bf16 = {"--training.mixed_precision_param=bfloat16"};
    if (model == "deepseek_v32") bf16.push_back("--model.converters=dsa_fused");
    expect_same_losses(reference(model, "bf16", local, bf16), layout(model, {"fsdp_bf16", 1, n, local, bf16}), 0,
                       "FSDP " + ranks + ", bf16 mixed precision");
  }
  // FP8 all-gather ([quantize.linear.float8] enable_fsdp_float8_all_gather) under bf16 mixed
  // precision: llama3 FP8 blockwise on FSDP 2 equals one rank (which quantizes its bf16 weights after
  // no gather at all), and its all-gathers carry the quantized weights in 1 byte a value plus the
  // block amax grids, against 2 bytes without it. The output head is quantized too (filter_fqns
  // matches nothing): [257, 256] (the test vocabulary) in shards of 129 rows, so rank 1's shard
  // starts inside the second 128-row block and ends in padding.
  static void fp8_all_gather_under_fsdp() {
    const std::vector<std::string> extra = {"--model.converters=quantize.linear.float8", "--training.seq_len=128", "--training.mixed_precision_param=bfloat16",
                                            "--quantize.linear.float8.filter_fqns=no_such_layer"};
    std::vector<std::string> gathered = extra;
    gathered.push_back("--quantize.linear.float8.enable_fsdp_float8_all_gather=true");
    const auto one = reference("llama3", "fp8_blockwise_bf16", 2, extra);
    auto& engine = distributed::CommEngine::get();
    engine.reset_stats();
    expect_same_losses(one, layout("llama3", {"fsdp_fp8_blockwise_bf16", 1, 2, 2, extra}), 1e-5,
                       "llama3 fp8_blockwise, bf16 weights: FSDP 2");
    const auto [bf16_bytes, bf16_calls] = fsdp_all_gathers();
    engine.reset_stats();
    const auto with_fp8 = layout("llama3", {"fsdp_fp8_gather_bf16", 1, 2, 2, gathered});
    const auto [fp8_bytes, fp8_calls] = fsdp_all_gathers();
    expect_same_losses(one, with_fp8, 1e-5, "llama3 fp8_blockwise, bf16 weights: FSDP 2 with FP8 all-gather");
    int64_t bits_apart = 0;
    for (size_t i = 0; i < one.size() && i < with_fp8.size(); ++i) bits_apart += one[i] != with_fp8[i];
    EXPECT_EQ(bits_apart, 0) << "steps whose loss is not bit-identical to one rank's";

    // The analytic traffic. Per gather of a quantized weight [d0, K] over n = 2 ranks each rank
    // sends its ceil(d0 / 2) rows to the other: 2 bytes a value in bf16, or 1 byte a value plus its
    // share of the amax grid (ceil(d0 / 128) x ceil(K / 128) f32 per rank) in one more call. Each
    // layer is gathered twice a step (forward, and again for backward), the output head once (kept
    // from its forward to its backward).
    struct Weight {
      int64_t d0, k, per_layer, gathers_per_step;
    };
    const int64_t steps = 20, layers = 6, n = 2;
    const std::vector<Weight> weights = {{256, 256, 4, 2}, {768, 256, 2, 2}, {256, 768, 1, 2}, {257, 256, 0, 1}};
    int64_t gathers = 0, bf16_share = 0, fp8_share = 0;
    for (const Weight& w : weights) {
      const int64_t count = steps * w.gathers_per_step * (w.per_layer ? w.per_layer * layers : 1);
      const int64_t rows = (w.d0 + n - 1) / n, grid = ((w.d0 + 127) / 128) * ((w.k + 127) / 128);
      gathers += count;
      bf16_share += count * (n - 1) * rows * w.k * 2;
      fp8_share += count * (n - 1) * (rows * w.k + grid * 4);
    }
    EXPECT_EQ(fp8_calls - bf16_calls, gathers) << "one amax all-gather per quantized weight's gather";
    EXPECT_EQ(bf16_bytes - fp8_bytes, bf16_share - fp8_share)
        << "FSDP all-gather bytes: " << bf16_bytes << " without FP8 all-gather, " << fp8_bytes << " with it";
    if (world().rank() == 0)
      std::printf("FP8 all-gather, llama3 debug FSDP 2 bf16, %lld steps: all-gather bytes %lld -> %lld (%.3f); "
                  "quantized weights %lld -> %lld (%.4f)\n",
                  (long long)steps, (long long)bf16_bytes, (long long)fp8_bytes, double(fp8_bytes) / double(bf16_bytes),
                  (long long)bf16_share, (long long)fp8_share, double(fp8_share) / double(bf16_share));
  }
};

const std::string kBf16 = "--training.mixed_precision_param=bfloat16";


}  // namespace

TEST_F(Layouts, Llama3) { check_layouts("llama3"); }
TEST_F(Layouts, DeepSeekV32MoeAndSparseAttention) { check_layouts("deepseek_v32"); }

// DeepSeek-V4 (mHC, CSA / HCA attention, hash and learned MoE, the indexers' KL loss) under the
// data-parallel layouts it runs: FSDP and DDP on 2 ranks, FSDP and HSDP on 4, to the last bit;
// on 2 ranks also FSDP under bf16 mixed precision (the GEMM weights' bf16 copies gathered from the
// f32 master shards) against the bf16 1-rank run, and FSDP with an MTP module against its own.
TEST_F(Layouts, DeepSeekV4DataParallel) {
  const int n = world().size();
  if (n != 2 && n != 4) GTEST_SKIP() << "layouts of 2 and 4 ranks";
  const int64_t local = 4 / n;
  const std::string ranks = std::to_string(n);
  const auto one = reference("deepseek_v4", "f32", local);
  expect_same_losses(one, layout("deepseek_v4", {"fsdp", 1, n, local}), 0, "deepseek_v4: FSDP " + ranks);
  if (n == 2) expect_same_losses(one, layout("deepseek_v4", {"ddp", 2, 1, local}), 0, "deepseek_v4: DDP 2");
  if (n == 2)
    expect_same_losses(reference("deepseek_v4", "bf16", local, {kBf16}), layout("deepseek_v4", {"fsdp_bf16", 1, 2, local, {kBf16}}),
                       0, "deepseek_v4: FSDP 2, bf16 mixed precision");
  if (n == 4) expect_same_losses(one, layout("deepseek_v4", {"hsdp", 2, 2, local}), 0, "deepseek_v4: HSDP 2 x 2");
  // Multi-token prediction (one module, a unit of its own, embedding and head shared) under FSDP 2.
  const std::vector<std::string> mtp = {"--model.mtp_layers=1"};
  if (n == 2)
    expect_same_losses(reference("deepseek_v4", "f32_mtp", local, mtp), layout("deepseek_v4", {"fsdp_mtp", 1, 2, local, mtp}),
                       0, "deepseek_v4: FSDP 2 with MTP");
}

TEST_F(Layouts, GradientAccumulation) {
  if (world().size() != 2) GTEST_SKIP() << "accumulation on 2 ranks";
  // 2 micro-batches of 1 sequence on each of 2 ranks against one rank accumulating all 4.
  std::vector<double> llama3;
  for (const std::string model : {"llama3", "deepseek_v32"}) {
    const auto one = reference(model, "f32_1", 1);
    expect_same_losses(one, layout(model, {"fsdp_accum", 1, 2, 1}), 0, model + ": FSDP 2 accumulating 2 micro-batches");
    if (model == "llama3") llama3 = one;
  }
  // DDP reduces once per step what each rank accumulated in its buckets, (m0 + m2) + (m1 + m3)
  // against the one rank's (m0 + m1) + (m2 + m3): equal to 1e-5 (llama3; a MoE model's routing
  // would amplify the last-bit difference over the steps).
  expect_same_losses(llama3, layout("llama3", {"ddp_accum", 2, 1, 1}), 1e-5,
                     "llama3: DDP 2 accumulating 2 micro-batches");
}

// The swap optimizer under FSDP (each rank streams its own shard's moments through 1 MiB chunks
// of a file) trains as one rank with AdamW in memory, to the last bit.
TEST_F(Layouts, SwapOptimizerUnderFsdp) {
  if (world().size() != 2) GTEST_SKIP() << "FSDP 2";
  for (const std::string model : {"llama3", "deepseek_v32"}) {
    const std::vector<std::string> swap = {"--optimizer.swap=file", "--optimizer.swap_chunk_mb=1"};
    expect_same_losses(reference(model, "f32_memory", 2), layout(model, {"fsdp_swap", 1, 2, 2, swap}), 0,
                       model + ": FSDP 2 with swapped optimizer state");
  }
}


// Quantized training (models/quantize.h, docs/precision.md) under FSDP 2 equals its 1-rank run,
// per recipe: FSDP quantizes each weight whole after its all-gather (no block meets a shard
// boundary; with FP8 all-gather, below, each shard with the whole weight's scales), activations are quantized per token along K, and the weight-gradient GEMMs' token
// tiles (128 FP8, 32 MX) stay within a sequence (seq_len 128; other lengths are refused), so no
// scale depends on how the batch is split. 1e-5 relative over 20 steps, as every layout.
TEST_F(Layouts, QuantizedRecipesUnderFsdp) {
  if (world().size() != 2) GTEST_SKIP() << "FSDP 2";
  const std::vector<std::pair<std::string, std::vector<std::string>>> recipes = {
      {"fp8_blockwise", {"--model.converters=quantize.linear.float8"}},
      {"mxfp8", {"--model.converters=quantize.linear.mx"}},
      {"mxfp4", {"--model.converters=quantize.linear.mx", "--quantize.linear.mx.recipe_name=mxfp4"}}};
  std::vector<double> last;
  for (auto [name, extra] : recipes) {
    extra.push_back("--training.seq_len=128");
    const auto one = reference("llama3", name, 2, extra);
    expect_same_losses(one, layout("llama3", {"fsdp_" + name, 1, 2, 2, extra}), 1e-5, "llama3 " + name + ": FSDP 2");
    last.push_back(one.back());
  }
  // The recipes are applied: FP4 weights train to another loss than FP8 ones.
  EXPECT_NE(last[0], last[2]);
  fp8_all_gather_under_fsdp();
  // deepseek_v32 under DeepSeek-V4's recipe: attention and shared experts FP8 blockwise, the routed
  // experts MXFP4 (the router in f32). Each rank's experts see half the sequences: wgrad's token
  // tiles restart at each sequence, so the scales are the 1-rank run's.
  const std::vector<std::string> ds = {"--model.converters=quantize.linear.float8,quantize.grouped_mm.mx",
                                       "--quantize.grouped_mm.mx.recipe_name=mxfp4", "--training.seq_len=128"};
  expect_same_losses(reference("deepseek_v32", "fp8_mxfp4_experts", 2, ds),
                     layout("deepseek_v32", {"fsdp_fp8_mxfp4_experts", 1, 2, 2, ds}), 1e-5,
                     "deepseek_v32 FP8 linears + MXFP4 experts: FSDP 2");
}
