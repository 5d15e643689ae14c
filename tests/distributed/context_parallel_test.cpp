// Context parallelism against one rank: the sequence ops (head-tail chunks, the all-gather into
// sequence order and its reduce-scatter backward), DeepSeek-V3.2's sparse attention split over
// CP against the whole model (the logits of every local token, the loss, every gradient, and
// the DSA all-gather's bytes against the analytic minimum), and the errors of settings CP cannot
// run. Training runs of each CP layout: context_parallel_layouts_test.cpp.
#include <cmath>

#include "distributed/common.h"
#include "titan/autograd/ops.h"
#include "titan/core/cpu_features.h"
#include "titan/core/rng.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/ring_attention.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/models/deepseek_v4/plan.h"
#include "titan/models/llama3/args.h"

using namespace titan;
using namespace titan::test;
using autograd::Variable;

namespace {

// Rows of tokens and their targets (every 7th ignored) for a model of `vocab` tokens.
std::pair<Tensor, Tensor> test_batch(int64_t b, int64_t s, int64_t vocab) {
  Tensor tokens = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({b * s}, DType::i32);
  for (int64_t i = 0; i < b * s; ++i) {
    tokens.data<int32_t>()[i] = int32_t((i * 37 + 11) % vocab);
    targets.data<int32_t>()[i] = i % 7 == 2 ? -100 : int32_t((i * 13 + 1) % vocab);
  }
  return {tokens, targets};
}

// The debug model whole, and split over cp with the same weights (sequences up to seq_len tokens).
std::pair<std::unique_ptr<models::CausalLM>, std::unique_ptr<models::CausalLM>> whole_and_split(
    const std::string& model, models::ModelOptions opts, const distributed::ProcessGroup& cp, int64_t vocab,
    int64_t seq_len = 48) {
  auto whole = models::build_model(model, "debugmodel", vocab, seq_len, opts);
  opts.cp = &cp;
  auto split = models::build_model(model, "debugmodel", vocab, seq_len, opts);
  whole->init_parameters(5);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : whole->state_dict()) state[name] = t;
  split->load_state_dict(state);
  return {std::move(whole), std::move(split)};
}

// Every parameter's gradient summed over the CP ranks equals the whole model's (within 2e-4 of
// its largest element, or of floor when that is larger).
void expect_gradients_sum_to_whole(nn::Module& whole, nn::Module& split, const distributed::ProcessGroup& cp,
                                   double floor = 1e-30) {
  std::map<std::string, Tensor> whole_grads;
  for (auto& [name, p] : whole.named_parameters()) whole_grads[name] = p->var.grad();
  for (auto& [name, p] : split.named_parameters()) {
    const Tensor want = whole_grads.at(name);
    ASSERT_EQ(want.defined(), p->var.grad().defined()) << name;
    if (!want.defined()) continue;
    Tensor sum = p->var.grad().contiguous().clone();
    cp.all_reduce(sum).wait();
    expect_close(want, sum, 2e-4, "gradient of " + name, floor);
  }
}

using CommStats = std::map<std::pair<std::string, distributed::CommOp>, distributed::CommStats>;

// The split model's logits are the whole model's at this rank's positions; then one training
// step of each from zero gradients: the loss and the indexer's KL (each rank's mean over its
// rows, summed over CP / c) are the whole model's. Returns what the split step communicated.
CommStats expect_split_step_equals_whole(models::CausalLM& whole, models::CausalLM& split,
                                         const distributed::ProcessGroup& cp, const Tensor& tokens,
                                         const Tensor& targets) {
  const int64_t b = tokens.size(0), s = tokens.size(1);
  whole.zero_grad();
  split.zero_grad();
  Tensor logits_whole, logits_mine;
  {
    autograd::NoGradGuard no_grad;
    logits_whole = whole.forward(tokens).value();
    logits_mine = split.forward(tokens).value();
  }
  const distributed::CpLayout layout = distributed::cp_layout(cp, s);
  const Tensor pos = distributed::local_positions(b, layout);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < layout.local_len(); ++i) {
      const int64_t p = pos.data<int32_t>()[i];
      const Tensor want = logits_whole.slice(0, bi * s + p, bi * s + p + 1);
      const Tensor got = logits_mine.slice(0, bi * layout.local_len() + i, bi * layout.local_len() + i + 1);
      expect_close(want.contiguous(), got.contiguous(), 1e-5, "logits of position " + std::to_string(p));
    }

  models::TrainingLoss lw = whole.training_loss(tokens, targets);
  autograd::backward(lw.total);
  distributed::CommEngine::get().reset_stats();
  models::TrainingLoss ls = split.training_loss(tokens, targets);
  autograd::backward(ls.total);
  const CommStats stats = distributed::CommEngine::get().stats();
  EXPECT_NEAR(ls.cross_entropy, lw.cross_entropy, 1e-6 * lw.cross_entropy);
  std::map<std::string, double> whole_terms(lw.terms.begin(), lw.terms.end());
  std::vector<double> kl = {0};
  for (const auto& [name, v] : ls.terms)
    if (name == "indexer_loss") kl[0] = v;
  cp.all_reduce(std::span<double>(kl));  // each rank's mean over its rows; equal rows per rank
  EXPECT_NEAR(kl[0] / cp.size(), whole_terms.at("indexer_loss"), 1e-5 * whole_terms.at("indexer_loss"));
  return stats;
}

TEST(ContextParallel, HeadTailChunksAndTheSequenceGather) {
  const distributed::ProcessGroup& cp = world();
  const int c = cp.size(), r = cp.rank();
  const int64_t b = 2, chunk = 3, s = 2 * c * chunk, w = 5;
  const distributed::CpLayout layout = distributed::cp_layout(cp, s);
  Tensor tokens = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < b * s; ++i) tokens.data<int32_t>()[i] = int32_t(i);
  const Tensor mine = distributed::local_chunks(tokens, layout), pos = distributed::local_positions(b, layout);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < 2 * chunk; ++i) {
      const int64_t want = i < chunk ? r * chunk + i : (2 * c - 1 - r) * chunk + (i - chunk);
      EXPECT_EQ(pos.data<int32_t>()[bi * 2 * chunk + i], want);
      EXPECT_EQ(mine.data<int32_t>()[bi * 2 * chunk + i], bi * s + want);
    }
  // The whole sequence x [B, S, W] (known to every rank): each rank gathers from its chunks.
  const Tensor whole = random_normal({b, s, w}, 3, "x"), dy = random_normal({b, s, w}, 4 + r, "dy");
  Tensor local = Tensor::empty({b, 2 * chunk, w}, DType::f32);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < 2 * chunk; ++i)
      for (int64_t k = 0; k < w; ++k)
        local.data<float>()[(bi * 2 * chunk + i) * w + k] = whole.data<float>()[(bi * s + pos.data<int32_t>()[i]) * w + k];
  Variable x(local, true);
  Variable g = distributed::gather_sequence(x, cp, layout);
  expect_close(whole, g.value(), 0, "gathered sequence");
  autograd::backward(g, dy);
  // Each rank's gradient: its rows of the sum of every rank's dy.
  Tensor want = Tensor::zeros({b, 2 * chunk, w}, DType::f32);
  for (int k = 0; k < c; ++k) {
    const Tensor dk = random_normal({b, s, w}, 4 + k, "dy");
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t i = 0; i < 2 * chunk; ++i)
        for (int64_t e = 0; e < w; ++e)
          want.data<float>()[(bi * 2 * chunk + i) * w + e] += dk.data<float>()[(bi * s + pos.data<int32_t>()[i]) * w + e];
  }
  expect_close(want, x.grad(), 1e-6, "gather backward");
}

// Ring attention on each rank's chunks against causal attention over the whole sequence, forward
// and backward (dk, dv brought home around the ring), on chunks that cross the kernels' tiles or
// are odd, with GQA and MQA, in f32 and bf16; and its sends against the schedule's bytes.
TEST(RingAttention, EqualsDenseAttentionForwardAndBackward) {
  auto cp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "cp_ring");
  const distributed::ProcessGroup& cp = *cp_group;
  const int c = cp.size();
  struct Case {
    int64_t b, chunk, h, hkv, dqk, dv;
    DType dtype;
  };
  for (const Case& k : {Case{2, 5, 4, 2, 12, 8, DType::f32}, Case{1, 70, 2, 1, 24, 16, DType::f32},
                        Case{1, 1, 3, 3, 8, 8, DType::f32}, Case{2, 9, 4, 2, 16, 16, DType::bf16}}) {
    const int64_t s = 2 * c * k.chunk;
    const std::string what = "chunk " + std::to_string(k.chunk) + " " + std::string(dtype_name(k.dtype));
    SCOPED_TRACE(what);
    const distributed::CpLayout layout = distributed::cp_layout(cp, s);
    // f32 leaves cast to the dtype (bf16's gradients then arrive in f32 through the cast).
    const Tensor q = random_normal({k.b, s, k.h, k.dqk}, 7, "q"), kk = random_normal({k.b, s, k.hkv, k.dqk}, 7, "k");
    const Tensor v = random_normal({k.b, s, k.hkv, k.dv}, 7, "v");
    const Tensor dout = random_normal({k.b, s, k.h, k.dv}, 7, "dout").to(k.dtype);
    auto in = [&](const Variable& x) { return autograd::cast(x, k.dtype); };
    Variable qw(q, true), kw(kk, true), vw(v, true);
    Variable ow = autograd::attention(in(qw), in(kw), in(vw));
    autograd::backward(ow, dout);
    Variable ql(distributed::local_chunks(q, layout), true), kl(distributed::local_chunks(kk, layout), true);
    Variable vl(distributed::local_chunks(v, layout), true);
    distributed::CommEngine::get().reset_stats();
    Variable ol = distributed::ring_attention(in(ql), in(kl), in(vl), cp);
    autograd::backward(ol, distributed::local_chunks(dout, layout));
    const auto stats = distributed::CommEngine::get().stats();
    const double tol = k.dtype == DType::f32 ? 2e-5 : 2e-2;
    expect_close(distributed::local_chunks(ow.value(), layout), ol.value(), tol, "o");
    expect_close(distributed::local_chunks(qw.grad(), layout), ql.grad(), tol, "dq");
    expect_close(distributed::local_chunks(kw.grad(), layout), kl.grad(), tol, "dk");
    expect_close(distributed::local_chunks(vw.grad(), layout), vl.grad(), tol, "dv");
    if (c == 1) continue;
    const distributed::RingTraffic t =
        distributed::ring_attention_traffic(kl.value().numel() + vl.value().numel(), k.dtype, c);
    expect_analytic_traffic(stats, "cp_ring", {{distributed::CommOp::send, t.forward + t.backward}});
  }
}

// The dense models under CP (ring attention in every layer) against the whole model: each
// rank's logits at its positions, the loss (DeepSeek-V3's with an MTP module: its loss too), the
// gradients summed over CP, and the ring's sends per layer against the schedule's bytes. Sequences of 48 and 40 tokens: chunks of 12 / 10 on 2
// ranks, 6 / 5 on 4.
TEST(RingAttention, DenseModelsEqualTheWholeModel) {
  flush_denormals(true);
  auto cp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "cp_dense");
  const distributed::ProcessGroup& cp = *cp_group;
  const int c = cp.size();
  const int64_t vocab = 257, b = 2;
  for (const std::string model : {"llama3", "deepseek_v3"}) {
    SCOPED_TRACE(model);
    models::ModelOptions opts;
    opts.mtp_layers = model == "deepseek_v3" ? 1 : 0;  // MTP on each rank's chunks, its block by ring attention
    auto [whole, split] = whole_and_split(model, opts, cp, vocab);
    for (int64_t s : {int64_t(48), int64_t(40)}) {
      if (s % (2 * c) != 0) continue;
      SCOPED_TRACE("S " + std::to_string(s));
      whole->zero_grad();
      split->zero_grad();
      const auto [tokens, targets] = test_batch(b, s, vocab);
      const distributed::CpLayout layout = distributed::cp_layout(cp, s);
      {
        autograd::NoGradGuard no_grad;
        const Tensor logits_whole = whole->forward(tokens).value().view({b, s, vocab});
        const Tensor logits_mine = split->forward(tokens).value().view({b, layout.local_len(), vocab});
        expect_close(distributed::local_chunks(logits_whole, layout), logits_mine, 1e-5, "logits");
      }
      models::TrainingLoss lw = whole->training_loss(tokens, targets);
      autograd::backward(lw.total);
      distributed::CommEngine::get().reset_stats();
      models::TrainingLoss ls = split->training_loss(tokens, targets);
      autograd::backward(ls.total);
      const auto stats = distributed::CommEngine::get().stats();
      EXPECT_NEAR(ls.cross_entropy, lw.cross_entropy, 1e-6 * lw.cross_entropy);
      ASSERT_EQ(ls.terms.size(), lw.terms.size());
      for (size_t i = 0; i < lw.terms.size(); ++i)
        EXPECT_NEAR(ls.terms[i].second, lw.terms[i].second, 1e-5 * std::fabs(lw.terms[i].second)) << lw.terms[i].first;
      expect_gradients_sum_to_whole(*whole, *split, cp);
      if (c == 1) continue;
      // Each layer's keys and values on this rank: [B, 2C, kv heads, key + value dims] f32.
      int64_t layers = 0, kv_width = 0;
      if (model == "llama3") {
        const auto a = models::llama3::llama3_flavor("debugmodel", vocab);
        layers = a.n_layers, kv_width = a.kv_heads() * 2 * a.head_dim();
      } else {
        const auto a = models::deepseek_v3::deepseek_v3_flavor("debugmodel", vocab);
        layers = a.n_layers + opts.mtp_layers;
        kv_width = a.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim);
      }
      const distributed::RingTraffic t = distributed::ring_attention_traffic(b * layout.local_len() * kv_width, DType::f32, c);
      expect_analytic_traffic(stats, "cp_dense", {{distributed::CommOp::send, double(layers) * (t.forward + t.backward)}});
    }
  }
}

// DeepSeek-V3.2 debugmodel split over CP against the whole model, fused kernels, top-16 of
// sequences of 48 / 40 (chunks of 12 or 6 / 10 or 5 positions: selections cross every chunk
// boundary), in one DSA stage: each rank's logits are the whole model's at its positions, the
// loss and the indexer loss are the whole model's, the parameters' gradients summed over CP are
// the whole model's, and the DSA traffic is one all-gather of the latent rows and indexer keys
// per layer forward and one reduce-scatter of their gradients backward (the indexer keys' alone
// in the dense warm-up, which trains only the indexer).
void expect_dsa_context_parallel_equals_whole(models::deepseek_v3::DsaStage stage) {
  flush_denormals(true);  // as training runs
  auto cp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "cp_dsa");
  const distributed::ProcessGroup& cp = *cp_group;
  const int c = cp.size();
  const int64_t vocab = 257, b = 2;
  models::ModelOptions opts;
  opts.converters = {"dsa_fused"};
  opts.dsa.warmup_steps = stage == models::deepseek_v3::DsaStage::dense_warmup ? 1 : 0;
  opts.dsa.topk = 16;
  auto [whole, split] = whole_and_split("deepseek_v32", opts, cp, vocab);
  for (auto* m : {whole.get(), split.get()}) m->begin_step(1);
  for (int64_t s : {int64_t(48), int64_t(40)}) {
    if (s % (2 * c) != 0) continue;
    SCOPED_TRACE("S " + std::to_string(s));
    const auto [tokens, targets] = test_batch(b, s, vocab);
    const CommStats stats = expect_split_step_equals_whole(*whole, *split, cp, tokens, targets);
    expect_gradients_sum_to_whole(*whole, *split, cp);

    const auto a = models::deepseek_v3::deepseek_v32_flavor("debugmodel", vocab);
    const double row_bytes = double(a.kv_lora_rank + a.qk_rope_head_dim + a.index_head_dim) * 4;
    const double per_row = double(a.n_layers) * double(c - 1) / c * double(b * s);
    const double grad_bytes = stage == models::deepseek_v3::DsaStage::sparse ? row_bytes : double(a.index_head_dim) * 4;
    expect_analytic_traffic(stats, "cp_dsa", {{distributed::CommOp::all_gather, per_row * row_bytes},
                                              {distributed::CommOp::reduce_scatter, per_row * grad_bytes}});
  }
}

TEST(DsaContextParallel, SparseStageEqualsTheWholeModel) {
  expect_dsa_context_parallel_equals_whole(models::deepseek_v3::DsaStage::sparse);
}

// The dense warm-up: dense attention in the absorbed form over the gathered latent rows, the
// indexer's KL target over every causal key.
TEST(DsaContextParallel, DenseWarmupEqualsTheWholeModel) {
  expect_dsa_context_parallel_equals_whole(models::deepseek_v3::DsaStage::dense_warmup);
}

// DeepSeek-V4 debugmodel (sliding, CSA and HCA layers, hash-routed MoE layers, the indexers
// training on their KL) split over CP against the whole model, sequences of 2c chunks of 64 (the
// window's 63 rows before each chunk come from the chunk before; HCA's 16 and CSA's 4 tokens
// tile it): each rank's logits are the whole model's at its positions, the loss and the indexer
// loss are the whole model's, the gradients summed over CP are the whole model's, and the
// traffic is what deepseek_v4/plan.h says (the family's `titan plan` figures): each chunk's rows
// from before it sent by the neighbouring rank and their gradients sent back, the entries'
// all-gathers forward and the same bytes reduce-scattered backward.
TEST(V4ContextParallel, EqualsTheWholeModel) {
  flush_denormals(true);  // as training runs
  auto cp_group = distributed::CommEngine::get().split(world(), 0, world().rank(), "cp_v4");
  const distributed::ProcessGroup& cp = *cp_group;
  const int c = cp.size();
  const int64_t vocab = 257, b = 2, s = 2 * c * 64;
  auto [whole, split] = whole_and_split("deepseek_v4", {}, cp, vocab, s);
  const auto [tokens, targets] = test_batch(b, s, vocab);
  const CommStats stats = expect_split_step_equals_whole(*whole, *split, cp, tokens, targets);

  // The hash-routed layers' router gradient is 0 but for rounding (~1e-10; both of a token's
  // slots name one expert at init, so its normalised weights' gradients cancel): an absolute floor.
  expect_gradients_sum_to_whole(*whole, *split, cp, 1e-5);

  const auto a = models::deepseek_v4::deepseek_v4_flavor("debugmodel", vocab);
  double sent = 0, gathered = 0;
  for (const auto t : a.layer_types) {
    const auto x = models::deepseek_v4::context_parallel_layer_traffic(a, t, b, s, c, 4, cp.rank());
    sent += x.sent_point_to_point(), gathered += x.entries + x.indexer;
  }
  expect_analytic_traffic(stats, "cp_v4", {{distributed::CommOp::send, 2 * sent},  // the rows, their gradients back
                                           {distributed::CommOp::all_gather, gathered},
                                           {distributed::CommOp::reduce_scatter, gathered}});
}

TEST(ContextParallel, SettingsItCannotRunAreRefused) {
  const distributed::ProcessGroup& cp = world();
  const int c = cp.size();
  models::ModelOptions opts;
  opts.cp = &cp;
  const auto refused = [&](const std::string& model, const models::ModelOptions& o, const std::string& says) {
    try {
      models::build_model(model, "debugmodel", 257, 64, o);
      ADD_FAILURE() << model << ": accepted; wanted an error saying " << says;
    } catch (const Error& e) {
      EXPECT_NE((e.message() + e.hint()).find(says), std::string::npos) << e.message() << "\n" << e.hint();
    }
  };
  opts.moe_aux_loss_alpha = 1e-3;
  refused("deepseek_v3", opts, "moe_aux_loss_alpha = 0");
  opts.moe_aux_loss_alpha = 0;
  opts.converters = {};
  refused("deepseek_v32", opts, "dsa_fused");
  opts.converters = {"dsa_fused"};
  EXPECT_NO_THROW(models::build_model("deepseek_v32", "debugmodel", 257, 64, opts));
  // A sequence that does not split into 2c chunks.
  try {
    distributed::cp_layout(cp, 2 * c * 5 + 1);
    FAIL() << "a sequence of " << 2 * c * 5 + 1 << " was split over " << c << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find(std::to_string(2 * c * 5)), std::string::npos) << e.hint();
  }
}

}  // namespace
