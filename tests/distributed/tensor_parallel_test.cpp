// Tensor + sequence parallelism against one rank: the parallel styles' ops against the plain ops
// (loss parallel against the gathered cross-entropy, the vocabulary-parallel embedding against
// the embedding, the sequence gather / reduce-scatter against their definitions, forward and
// backward), a llama3 step split over TP against the whole model (loss, every gradient, and the
// bytes of every collective against the plan's analytic minimum), 20 training steps of each TP
// layout against the 1-rank run, and the errors of degrees that do not divide the model.
#include <cmath>

#include "distributed/common.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/core/rng.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/core/cpu_features.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/llama3/model.h"

using namespace titan;
using namespace titan::test;
using autograd::Variable;

namespace {

// Columns [lo, hi) of a 2-D tensor, contiguous; rows likewise.
Tensor columns(const Tensor& t, int64_t lo, int64_t hi) { return t.slice(1, lo, hi).contiguous(); }
Tensor rows(const Tensor& t, int64_t lo, int64_t hi) { return t.slice(0, lo, hi).contiguous(); }

// Targets over the whole vocabulary (every slice owns some), every 5th ignored.
Tensor targets_for(int64_t n, int64_t vocab) {
  Tensor t = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = i % 5 == 3 ? -100 : int32_t((i * 7 + 3) % vocab);
  return t;
}

TEST(LossParallel, EqualsTheGatheredCrossEntropy) {
  const distributed::ProcessGroup& tp = world();
  const int t = tp.size(), r = tp.rank();
  const int64_t n = 37, cols = 13, vocab = cols * t;  // odd sizes
  for (DType dt : {DType::f32, DType::bf16}) {
    // f32 leaves, cast to the logits' dtype (a leaf's gradient is f32).
    const Tensor full = random_normal({n, vocab}, 11, "logits", 3.0);
    const Tensor targets = targets_for(n, vocab);
    Variable whole(full.contiguous(), true);
    Variable loss = autograd::cross_entropy(autograd::cast(whole, dt), targets);
    const double want = loss.value().item();
    autograd::backward(loss);
    Variable mine(columns(full, r * cols, (r + 1) * cols), true);
    Variable got = distributed::cross_entropy_vocab_parallel(autograd::cast(mine, dt), targets, tp);
    const double tol = dt == DType::f32 ? 1e-6 : 1e-3;
    EXPECT_NEAR(got.value().item(), want, tol * std::fabs(want)) << dtype_name(dt);
    autograd::backward(got);
    // f32: the two softmaxes take their exponentials over rows of other widths (13 columns against
    // 13 x t), so the vector and tail paths differ by a few ulps (measured 1.006e-6 of the largest
    // gradient on the AMD EPYC with AVX-512; under 1e-6 on the AVX2 machines before it).
    expect_close(columns(whole.grad(), r * cols, (r + 1) * cols), mine.grad(), dt == DType::f32 ? 4e-6 : 1e-2,
                 std::string("dlogits ") + std::string(dtype_name(dt)));
  }
}

TEST(SequenceParallel, GatherAndReduceScatterForwardAndBackward) {
  const distributed::ProcessGroup& tp = world();
  const int t = tp.size(), r = tp.rank();
  const int64_t n = 3, d = 5;
  // Every rank's piece and upstream gradient, known to all (seeded by rank).
  std::vector<Tensor> x, dy_all;
  for (int k = 0; k < t; ++k) {
    x.push_back(random_normal({n, d}, 100 + k, "x"));
    dy_all.push_back(random_normal({t * n, d}, 200 + k, "dy"));
  }
  Variable xv(x[size_t(r)].contiguous(), true);
  Variable y = distributed::gather_tokens(xv, tp);  // [t n, d]
  for (int k = 0; k < t; ++k) expect_close(x[size_t(k)], rows(y.value(), k * n, (k + 1) * n), 0, "gathered piece");
  autograd::backward(y, dy_all[size_t(r)]);
  Tensor want = Tensor::zeros({n, d}, DType::f32);  // the sum of every rank's gradient of my rows
  for (int k = 0; k < t; ++k)
    for (int64_t i = 0; i < n * d; ++i) want.data<float>()[i] += dy_all[size_t(k)].data<float>()[r * n * d + i];
  expect_close(want, xv.grad(), 1e-6, "gather backward");

  Variable zv(dy_all[size_t(r)].contiguous(), true);  // partial sums over all tokens
  Variable z = distributed::reduce_scatter_tokens(zv, tp);  // [n, d]
  expect_close(want, z.value(), 1e-6, "reduce-scattered rows");
  autograd::backward(z, x[size_t(r)].contiguous());
  for (int k = 0; k < t; ++k) expect_close(x[size_t(k)], rows(zv.grad(), k * n, (k + 1) * n), 0, "reduce-scatter backward");
}

TEST(VocabularyParallel, EmbeddingEqualsTheWholeTable) {
  const distributed::ProcessGroup& tp = world();
  const int t = tp.size(), r = tp.rank();
  const int64_t table_rows = 7, vocab = table_rows * t, d = 6, n = 5 * t;
  const Tensor table = random_normal({vocab, d}, 5, "table");
  Tensor ids = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) ids.data<int32_t>()[i] = int32_t((i * 5 + 2) % vocab);
  const Tensor dy = random_normal({n, d}, 6, "dy");
  Variable whole(table.contiguous(), true);
  Variable y = autograd::embedding(ids, whole, DType::f32);
  autograd::backward(y, dy);
  Variable mine(rows(table, r * table_rows, (r + 1) * table_rows), true);
  Variable got = distributed::embedding_vocab_parallel(ids, mine, DType::f32, tp);  // my tokens' rows
  const int64_t piece = n / t;
  expect_close(rows(y.value(), r * piece, (r + 1) * piece), got.value(), 0, "embedding rows");
  autograd::backward(got, rows(dy, r * piece, (r + 1) * piece));
  expect_close(rows(whole.grad(), r * table_rows, (r + 1) * table_rows), mine.grad(), 1e-6, "table gradient");
}

// A llama3 debugmodel step (2 x 1024 tokens) split over TP equals the whole model's, and its
// traffic is exactly the plan's: per block 2 all-gathers and 2 reduce-scatters of the [N, D]
// activations forward and again backward, one more pair for the embedding and the final norm,
// loss parallel's all-reduces of 3 N floats, and one all-reduce of the norms' partial gradients.
TEST(TensorParallelLlama3, OneStepEqualsTheWholeModelWithTheAnalyticTraffic) {
  auto tp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "tp_llama3");
  const distributed::ProcessGroup& tp = *tp_group;
  const int t = tp.size();
  const int64_t vocab = 260, b = 2, s = 1024, n = b * s;
  models::ModelOptions opts;
  auto whole = models::build_model("llama3", "debugmodel", vocab, s, opts);
  whole->init_parameters(7);
  Tensor tokens = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) {
    tokens.data<int32_t>()[i] = int32_t((i * 31 + 7) % vocab);
    targets.data<int32_t>()[i] = int32_t((i * 17 + 5) % vocab);
  }
  models::TrainingLoss want = whole->training_loss(tokens, targets);
  autograd::backward(want.total);
  // The synchronous plan, then async TP (the same bytes, overlapped with the projections).
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async TP" : "TP");
    opts.tp = &tp;
    opts.async_tp = async;
    auto split = models::build_model("llama3", "debugmodel", vocab, s, opts);
    split->init_parameters(7);
    distributed::CommEngine::get().reset_stats();
    models::TrainingLoss got = split->training_loss(tokens, targets);
    autograd::backward(got.total);
    const auto params = nn::trainable_params(split->named_parameters());
    distributed::sum_partial_gradients(params, tp);
    const auto stats = distributed::CommEngine::get().stats();

    EXPECT_NEAR(got.cross_entropy, want.cross_entropy, 1e-6 * want.cross_entropy);
    std::map<std::string, Tensor> whole_grads;
    for (auto& [name, p] : whole->named_parameters()) whole_grads[name] = p->var.grad();
    int64_t replicated = 0;
    for (const nn::TrainableParam& p : params) {
      Tensor w = whole_grads.at(p.name);
      if (!p.slice.global_shape.empty())
        for (int d = 0; d < p.slice.offsets.size(); ++d)
          w = w.slice(d, p.slice.offsets[d], p.slice.offsets[d] + p.var.shape()[d]);
      else
        replicated += p.var.value().numel();
      expect_close(w.contiguous(), p.var.grad(), 1e-4, "gradient of " + p.name);
    }

    const auto a = models::llama3::llama3_flavor("debugmodel", vocab);
    const double x = double(n * a.dim * 4), share = double(t - 1) / t;
    const double sublayer_pairs = 2.0 * double(a.n_layers) + 1;  // attention, FFN; the embedding / final norm
    const std::map<distributed::CommOp, double> want_bytes = {
        {distributed::CommOp::all_gather, 2 * sublayer_pairs * share * x},
        {distributed::CommOp::reduce_scatter, 2 * sublayer_pairs * share * x},
        {distributed::CommOp::all_reduce, 2 * share * (3.0 * double(n) * 4 + double(replicated) * 4)}};
    expect_analytic_traffic(stats, "tp_llama3", want_bytes);
  }
}

// DeepSeek-V3.2 (MLA with the lightning indexer, MoE with shared experts) and DeepSeek-V3 split
// over TP against the whole model: one step's loss, indexer loss and every gradient, in the
// dense warm-up and the sparse stage. The routed experts see each rank's tokens only (the MoE
// TP fix), so their gradients, like the replicated projections', are summed over TP; under
// TorchTitan's scheme (deepseek_v3 gather) they are split by hidden units instead. DeepSeek-V3
// runs with an MTP module (its loss and gradients too). Async TP ("async") equals the whole model
// too, and moves the synchronous plan's bytes per collective type.
TEST(TensorParallelDeepSeek, OneStepEqualsTheWholeModel) {
  flush_denormals(true);  // as training runs
  auto tp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "tp_deepseek");
  const distributed::ProcessGroup& tp = *tp_group;
  const int64_t vocab = 260, b = 2, s = 48, n = b * s;
  Tensor tokens = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i) {
    tokens.data<int32_t>()[i] = int32_t((i * 31 + 7) % vocab);
    targets.data<int32_t>()[i] = i % 9 == 4 ? -100 : int32_t((i * 17 + 5) % vocab);
  }
  // The synchronous plan's bytes per (model, step), which async TP must move too.
  std::map<std::pair<std::string, int64_t>, std::map<std::pair<std::string, distributed::CommOp>, distributed::CommStats>>
      sync_bytes;
  for (const std::string model : {"deepseek_v32", "deepseek_v32 async", "deepseek_v3", "deepseek_v3 async",
                                  "deepseek_v3 gather", "deepseek_v3 gather async"}) {
    const bool async = model.ends_with(" async");
    const std::string plan = async ? model.substr(0, model.size() - 6) : model;
    models::ModelOptions opts;
    opts.async_tp = async;
    opts.moe_tp_gather = model.starts_with("deepseek_v3 gather");  // TorchTitan's MoE scheme
    if (plan == "deepseek_v3") opts.mtp_layers = 1;        // the MTP module split like the blocks
    if (plan == "deepseek_v32") {  // step 1: the dense warm-up; step 2: the sparse stage
      opts.converters = {"dsa_fused"};
      opts.dsa.warmup_steps = 1;
      opts.dsa.topk = 16;
    }
    const std::string name = model.substr(0, model.find(' '));
    auto whole = models::build_model(name, "debugmodel", vocab, s, opts);
    opts.tp = &tp;
    auto split = models::build_model(name, "debugmodel", vocab, s, opts);
    whole->init_parameters(3);
    split->init_parameters(3);
    for (int64_t step : {int64_t(1), int64_t(2)}) {
      if (name == "deepseek_v3" && step == 1) continue;  // no DSA stages
      whole->zero_grad();
      split->zero_grad();
      whole->begin_step(step);
      split->begin_step(step);
      const std::string what = model + (name == "deepseek_v3" ? "" : step == 1 ? " dense warm-up" : " sparse stage");
      models::TrainingLoss want = whole->training_loss(tokens, targets);
      autograd::backward(want.total);
      distributed::CommEngine::get().reset_stats();
      models::TrainingLoss got = split->training_loss(tokens, targets);
      autograd::backward(got.total);
      const auto stats = distributed::CommEngine::get().stats();
      if (!async) sync_bytes[{plan, step}] = stats;
      for (const auto& [key, want_stats] : sync_bytes.at({plan, step}))
        EXPECT_EQ(stats.at(key).bytes, want_stats.bytes) << what << ": " << distributed::comm_op_name(key.second);
      const auto params = nn::trainable_params(split->named_parameters());
      distributed::sum_partial_gradients(params, tp);
      EXPECT_NEAR(got.cross_entropy, want.cross_entropy, 1e-6 * want.cross_entropy) << what;
      std::map<std::string, double> want_terms(want.terms.begin(), want.terms.end());
      for (const auto& [term, v] : got.terms) {
        if (term != "indexer_loss" && term != "mtp_loss") continue;
        EXPECT_NEAR(v, want_terms.at(term), 1e-5 * want_terms.at(term)) << what;
      }
      std::map<std::string, Tensor> whole_grads;
      for (auto& [param, p] : whole->named_parameters()) whole_grads[param] = p->var.grad();
      for (const nn::TrainableParam& p : params) {
        Tensor w = whole_grads.at(p.name);
        ASSERT_EQ(w.defined(), p.var.grad().defined()) << what << ": " << p.name;
        if (!w.defined()) continue;
        if (!p.slice.global_shape.empty())
          for (int d = 0; d < p.slice.offsets.size(); ++d)
            w = w.slice(d, p.slice.offsets[d], p.slice.offsets[d] + p.var.shape()[d]);
        expect_close(w.contiguous(), p.var.grad(), 2e-4, what + ": gradient of " + p.name);
      }
    }
  }
}

TEST(TensorParallelLlama3, DegreesThatDoNotDivideTheModelAreRefused) {
  const auto a = models::llama3::llama3_flavor("debugmodel", 260);
  EXPECT_NO_THROW(models::llama3::check_tensor_parallel(a, 4));
  const std::string heads = error_of([&] { models::llama3::check_tensor_parallel(a, 3); });
  EXPECT_NE(heads.find("16 attention heads"), std::string::npos) << heads;
  EXPECT_NE(heads.find(": 1, 2, 4"), std::string::npos) << heads;  // the hint: the degrees that divide
  auto b = models::llama3::llama3_flavor("debugmodel", 257);
  const std::string vocab = error_of([&] { models::llama3::check_tensor_parallel(b, 2); });
  EXPECT_NE(vocab.find("257 vocabulary entries"), std::string::npos) << vocab;
  b.n_kv_heads = 2;
  const std::string kv_heads = error_of([&] { models::llama3::check_tensor_parallel(b, 4); });
  EXPECT_NE(kv_heads.find("2 KV heads"), std::string::npos) << kv_heads;
  auto ds = models::deepseek_v3::deepseek_v32_flavor("debugmodel", 260);
  EXPECT_NO_THROW(models::deepseek_v3::check_tensor_parallel(ds, 4));
  const std::string ds_heads = error_of([&] { models::deepseek_v3::check_tensor_parallel(ds, 3); });
  EXPECT_NE(ds_heads.find("attention heads"), std::string::npos) << ds_heads;
  EXPECT_NE(ds_heads.find(": 1, 2, 4"), std::string::npos) << ds_heads;
}

// Training: every TP layout of this world size against one rank, 20 steps, f32.
class TpLayouts : public TrainingSuite<TpLayouts, 260> {
 public:
  static constexpr const char* kTag = "tp_layouts";

 protected:
  static train::JobConfig config(const std::string& name, int64_t shard, int64_t tp, int64_t replicate, int64_t local,
                                 const std::vector<std::string>& extra = {}) {
    train::JobConfig cfg =
        layout_config("llama3", data(), root() / name, {.replicate = replicate, .shard = shard, .tp = tp}, extra);
    cfg.training.local_batch_size = local;
    return cfg;
  }
};

TEST_F(TpLayouts, Llama3ReproducesOneRank) {
  const int n = world().size();

  const auto one = reference_on_rank0(config("reference", 1, 1, 1, 4, validation_every_10(4)));
  // TP over every rank: each sees the whole batch.
  expect_same_losses(one, train_on(config("tp", 1, n, 1, 4, validation_every_10(4)), world()), 1e-5,
                     "TP " + std::to_string(n));
  expect_same_losses(losses_of(root() / "reference", "validation"), losses_of(root() / "tp", "validation"), 1e-5,
                     "TP " + std::to_string(n) + ", validation loss");
  if (n == 4) {
    expect_same_losses(one, train_on(config("fsdp_tp", 2, 2, 1, 2, validation_every_10(2)), world()), 1e-5, "FSDP 2 x TP 2");
    expect_same_losses(one, train_on(config("ddp_tp", 1, 2, 2, 2), world()), 1e-5, "DDP 2 x TP 2");
    expect_same_losses(one,
                       train_on(config("fsdp_tp_ac", 2, 2, 1, 2, {"--activation_checkpoint.mode=selective"}), world()),
                       1e-5, "FSDP 2 x TP 2, selective activation checkpointing");
  }
}

// A checkpoint saved under TP (FSDP x TP on 4 ranks: pieces split on dim 0 of dim-1 slices)
// resumes on one rank, which continues the TP run's losses, and a 1-rank checkpoint resumes
// under TP; the assembled weights are the whole parameters (generate / convert read them).
TEST_F(TpLayouts, CheckpointsReshardBetweenTpAndOneRank) {
  const int n = world().size();
  const int64_t shard = n == 4 ? 2 : 1, tp = n == 4 ? 2 : n;
  const std::vector<std::string> save = {"--checkpoint.enable=true", "--checkpoint.interval=10",
                                         "--checkpoint.keep_latest_k=0", "--checkpoint.last_save_model_only=false"};
  const auto straight = train_on(config("ckpt_tp", shard, tp, 1, 4 / shard, save), world());
  ASSERT_EQ(straight.size(), 20u);
  const auto seed = [&](const std::string& from, const std::string& to, int step) {
    if (world().rank() == 0) {
      const std::string folder = "step-" + std::to_string(step);
      fs::remove_all(root() / to);
      fs::create_directories(root() / to / "checkpoint");
      fs::copy(root() / from / "checkpoint" / folder, root() / to / "checkpoint" / folder, fs::copy_options::recursive);
    }
    world().barrier().wait();
  };
  seed("ckpt_tp", "ckpt_one", 10);
  const auto one = reference_on_rank0(config("ckpt_one", 1, 1, 1, 4, save));
  expect_same_losses(std::vector<double>(straight.begin() + 10, straight.end()), one, 1e-5, "TP checkpoint -> 1 rank");
  if (world().rank() == 0) {
    const auto ckpt = checkpoint::load_checkpoint(root() / "ckpt_tp" / "checkpoint" / "step-10");
    const auto a = models::llama3::llama3_flavor("debugmodel", 260);
    EXPECT_EQ(ckpt.tensors.at("model.layers.0.attention.wo.weight").shape(), Shape({a.dim, a.dim}));
    EXPECT_EQ(ckpt.tensors.at("model.tok_embeddings.weight").shape(), Shape({260, a.dim}));
  }
  // The 1-rank run's own step-20 checkpoint, continued to step 30 on one rank and under TP.
  std::vector<std::string> longer = save;
  longer.push_back("--training.steps=30");
  seed("ckpt_one", "ckpt_one_more", 20);
  const auto more = reference_on_rank0(config("ckpt_one_more", 1, 1, 1, 4, longer));
  seed("ckpt_one", "ckpt_back", 20);
  const auto back = train_on(config("ckpt_back", shard, tp, 1, 4 / shard, longer), world());
  ASSERT_EQ(more.size(), 10u);
  expect_same_losses(more, back, 1e-5, "1-rank checkpoint -> TP");
}

// DeepSeek-V3.2 (3 dense warm-up steps, then the sparse stage) under TP and FSDP x TP against one
// rank, 20 steps at lr 3e-4 (see context_parallel_layouts_test: at higher rates MoE routing and top-k
// amplify the last-bit differences of another summation order after a gradient spike).
TEST_F(TpLayouts, DeepSeekV32ReproducesOneRank) {
  const int n = world().size();
  std::vector<std::string> ds = {"--model.converters=dsa_fused", "--optimizer.lr=3e-4"};
  const auto config_of = [&](const std::string& name, int64_t shard, int64_t tp, int64_t local) {
    train::JobConfig c = config(name, shard, tp, 1, local, ds);
    c.model.name = "deepseek_v32";
    c.dsa.warmup_steps = 3;
    c.dsa.topk = 16;
    return c;
  };
  const auto one = reference_on_rank0(config_of("ds_reference", 1, 1, 4));
  expect_same_losses(one, train_on(config_of("ds_tp", 1, n, 4), world()), 1e-5, "deepseek_v32 TP " + std::to_string(n));
  if (n == 4) expect_same_losses(one, train_on(config_of("ds_fsdp_tp", 2, 2, 2), world()), 1e-5, "deepseek_v32 FSDP 2 x TP 2");
}

TEST_F(TpLayouts, AVocabularyTheDegreeDoesNotDivideIsRefused) {
  const int n = world().size();
  train::JobConfig cfg = config("bad_vocab", 1, n, 1, 4);
  const fs::path other = root() / "vocab257";
  if (world().rank() == 0) prepare_templated_dataset(other, 257);
  world().barrier().wait();
  cfg.training.dataset_path = (other / "prepared").string();
  try {
    train::Trainer t(cfg, "bad_vocab.toml", &world());
    FAIL() << "TP " << n << " over a vocabulary of 257 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("bad_vocab.toml"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("257 vocabulary entries"), std::string::npos) << e.message();
  }
}

}  // namespace

namespace {

// Async TP trains as one rank does (llama3, with activation checkpointing: the selective
// recompute reuses its kept outputs, the full one runs its collectives again; deepseek_v32
// through its dense warm-up and sparse stage).
TEST_F(TpLayouts, AsyncTensorParallelReproducesOneRank) {
  const int n = world().size();
  const std::string async = "--parallelism.enable_async_tensor_parallel=true";
  const auto one = reference_on_rank0(config("async_reference", 1, 1, 1, 4));
  expect_same_losses(one, train_on(config("async_tp", 1, n, 1, 4, {async, "--activation_checkpoint.mode=selective"}), world()),
                     1e-5, "async TP " + std::to_string(n) + ", selective activation checkpointing");
  if (n == 4)
    expect_same_losses(one, train_on(config("async_fsdp_tp", 2, 2, 1, 2, {async, "--activation_checkpoint.mode=full"}), world()),
                       1e-5, "FSDP 2 x async TP 2, full activation checkpointing");
  const auto deepseek = [&](const std::string& name, int64_t shard, int64_t tp, int64_t local, std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--model.converters=dsa_fused", "--optimizer.lr=3e-4"});
    train::JobConfig c = config(name, shard, tp, 1, local, extra);
    c.model.name = "deepseek_v32";
    c.dsa.warmup_steps = 3;
    c.dsa.topk = 16;
    return c;
  };
  const auto ds_one = reference_on_rank0(deepseek("async_ds_reference", 1, 1, 4, {}));
  expect_same_losses(ds_one, train_on(deepseek("async_ds_tp", 1, n, 4, {async}), world()), 1e-5,
                     "deepseek_v32 async TP " + std::to_string(n));
  if (n == 4)
    expect_same_losses(ds_one, train_on(deepseek("async_ds_fsdp_tp", 2, 2, 2, {async, "--activation_checkpoint.mode=full"}),
                                        world()),
                       1e-5, "deepseek_v32 FSDP 2 x async TP 2, full activation checkpointing");
}

}  // namespace
