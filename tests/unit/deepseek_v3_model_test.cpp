// DeepSeek-V3 args and model: parameter counts (671B ~ 671B total / ~37B activated, MTP
// excluded as in DeepSeek's 671B), flavors, the analytic state list against the built model,
// the MoE seam, FLOPs, and the registry.
#include <gtest/gtest.h>

#include <cmath>

#include "common/kernel_check.h"
#include "titan/autograd/ops.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"

using namespace titan;
using namespace titan::models::deepseek_v3;

TEST(DeepSeekV3Args, FullSizeParameterCounts) {
  // DeepSeek-V3 report: 671B total, 37B activated per token; the 14B MTP module (which makes the
  // published 685B) is not part of this count.
  const DeepSeekV3Args::ParamCount c = deepseek_v3_flavor("671B").parameters();
  EXPECT_NEAR(double(c.total) / 1e9, 671.0, 1.0);
  EXPECT_NEAR(double(c.active) / 1e9, 37.5, 0.7);
  EXPECT_EQ(c.embedding, 129280 * 7168);
  // DeepSeek-V2-Lite (16B): 15.7B total, 2.4B activated; DeepSeek-V2 (236B): 236B / 21B.
  const DeepSeekV3Args::ParamCount lite = deepseek_v3_flavor("16B").parameters();
  EXPECT_NEAR(double(lite.total) / 1e9, 15.7, 0.2);
  EXPECT_NEAR(double(lite.active) / 1e9, 2.7, 0.3);
  const DeepSeekV3Args::ParamCount v2 = deepseek_v3_flavor("236B").parameters();
  EXPECT_NEAR(double(v2.total) / 1e9, 236, 2);
  EXPECT_NEAR(double(v2.active) / 1e9, 21, 1.5);
  // The benchmark-sized flavor (bench_train_step): ~100M total, ~36M active with a 2048 vocabulary.
  const DeepSeekV3Args::ParamCount m100 = deepseek_v3_flavor("100M").parameters();
  EXPECT_NEAR(double(m100.total) / 1e6, 107.5, 1.0);
  EXPECT_NEAR(double(m100.active) / 1e6, 36.0, 1.0);
}

TEST(DeepSeekV3Args, FlavorsAndErrors) {
  for (const std::string& f : deepseek_v3_flavor_names()) EXPECT_NO_THROW(deepseek_v3_flavor(f, 1000)) << f;
  const DeepSeekV3Args d = deepseek_v3_flavor("debugmodel", 2000);
  EXPECT_EQ(d.vocab_size, 2000);
  EXPECT_EQ(d.dim, 256);
  EXPECT_EQ(d.q_lora_rank, 0);
  EXPECT_EQ(d.n_activated_experts, 3);
  const DeepSeekV3Args b = deepseek_v3_flavor("671B");
  EXPECT_EQ(b.score_func, ScoreFunc::sigmoid);
  EXPECT_TRUE(b.route_norm);
  EXPECT_DOUBLE_EQ(b.route_scale, 2.5);
  EXPECT_EQ(b.n_expert_groups, 8);
  EXPECT_EQ(b.n_limited_groups, 4);
  try {
    deepseek_v3_flavor("7B");
    FAIL() << "unknown flavor accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.hint().find("671B"), std::string::npos) << e.what();
  }
  DeepSeekV3Args bad = d;
  bad.n_activated_experts = 9;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(DeepSeekV3Model, StandInIsAllDenseAndMatchesTheAnalyticState) {
  DeepSeekV3Args a = deepseek_v3_flavor("debugmodel", 512);
  a.n_layers = 3;
  Transformer model(a);
  EXPECT_EQ(model.args().n_dense_layers, 3);  // no MoE factory: every layer dense
  const auto shapes = state_shapes(model.args());
  const auto state = model.state_dict();
  ASSERT_EQ(shapes.size(), state.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    EXPECT_EQ(shapes[i].first, state[i].first);
    EXPECT_EQ(shapes[i].second, state[i].second.shape()) << shapes[i].first;
  }
  EXPECT_EQ(model.num_parameters(), model.args().parameters().total);
  // TorchTitan's FLOPs: 6 * (params - embedding) + 6 * L * H * (192 + 128) * S.
  const double want = 6.0 * double(model.num_parameters() - 512 * 256) + 6.0 * 3 * 16 * 320 * 64;
  EXPECT_DOUBLE_EQ(model.training_flops_per_token(64), want);
}

namespace {
// A stand-in "MoE" for the seam test: a dense FFN under the MoE's registration name.
class FakeMoe : public BlockFeedForward {
 public:
  explicit FakeMoe(int64_t dim) : inner(register_module("shared_experts", std::make_unique<FeedForward>(dim, 8, 0.02))) {}
  autograd::Variable forward(const autograd::Variable& x, models::AuxLosses* = nullptr) override { return inner.forward(x); }
  FeedForward& inner;
};
}  // namespace

TEST(DeepSeekV3Model, MoeFactoryFillsTheMoeLayers) {
  DeepSeekV3Args a = deepseek_v3_flavor("debugmodel", 64);
  a.n_layers = 3, a.dim = 32, a.n_heads = 2, a.kv_lora_rank = 16, a.qk_nope_head_dim = 8, a.qk_rope_head_dim = 4;
  a.v_head_dim = 8, a.inter_dim = 16;
  std::vector<int> built;
  Transformer model(a, [&](const DeepSeekV3Args& args, int layer, const distributed::ProcessGroup* tp) {
    EXPECT_EQ(tp, nullptr);  // one rank
    built.push_back(layer);
    return std::make_unique<FakeMoe>(args.dim);
  });
  EXPECT_EQ(built, (std::vector<int>{1, 2}));
  EXPECT_EQ(model.args().n_dense_layers, 1);
  bool dense0 = false, moe2 = false;
  for (const auto& [name, p] : model.named_parameters()) {
    dense0 |= name == "layers.0.feed_forward.w1.weight";
    moe2 |= name == "layers.2.moe.shared_experts.w1.weight";
  }
  EXPECT_TRUE(dense0 && moe2);
  model.init_parameters(1);
  Tensor tokens = Tensor::zeros({1, 5}, DType::i32);
  EXPECT_EQ(model.forward(tokens).shape(), Shape({5, 64}));
}

// The registry's debugmodel (dense layer, MoE layers with a router and shared experts) trains:
// the first backward gives every parameter a finite, non-zero gradient, and AdamW steps over the
// registry's parameter list fit one batch far below chance.
TEST(DeepSeekV3Model, RegistryBuildsItAndItTrains) {
  std::unique_ptr<models::CausalLM> m = models::build_model("deepseek_v3", "debugmodel", 128, 32);
  EXPECT_EQ(m->vocab_size(), 128);
  EXPECT_GE(m->max_seq_len(), 32);
  m->init_parameters(5);
  Tensor tokens = Tensor::empty({2, 9}, DType::i32), targets = Tensor::empty({18}, DType::i32);
  for (int i = 0; i < 18; ++i) tokens.data<int32_t>()[i] = (i * 7) % 128, targets.data<int32_t>()[i] = (i * 7 + 7) % 128;
  const auto params = m->named_parameters();
  kernels::AdamWParams cfg;
  cfg.lr = 1e-3;
  optim::AdamW opt(params, cfg);
  double first = 0, last = 0;
  for (int step = 0; step < 5; ++step) {
    m->zero_grad();
    autograd::Variable loss = autograd::cross_entropy(m->forward(tokens), targets);
    autograd::backward(loss);
    if (step == 0) {
      for (auto& [name, p] : params) {
        ASSERT_TRUE(p->var.grad().defined()) << name;
        int64_t nonfinite = 0;
        double largest = 0;
        for (double g : test::to_doubles(p->var.grad())) {
          nonfinite += !std::isfinite(g);
          largest = std::max(largest, std::fabs(g));
        }
        EXPECT_EQ(nonfinite, 0) << name;
        EXPECT_GT(largest, 0) << name << ": an all-zero gradient";
      }
    }
    opt.step(cfg.lr, optim::clip_grad_norm(params, 1.0).scale);
    m->end_step([](Tensor&) {});
    (step == 0 ? first : last) = loss.value().item();
  }
  EXPECT_NEAR(first, std::log(128.0), 1.0);  // near chance before training
  EXPECT_LT(last, 0.5 * first);
}

// [model] moe_load_balance_coeff / moe_aux_loss_alpha reach every MoE layer: after one step the
// biases are nonzero multiples of coefficient / 8 (+-coefficient, shifted to zero mean over the 8
// experts), and the balance loss joins the auxiliary losses only when alpha > 0.
TEST(DeepSeekV3Model, RegistryPassesTheBalancingOptions) {
  Tensor tokens = Tensor::empty({2, 9}, DType::i32);
  for (int i = 0; i < 18; ++i) tokens.data<int32_t>()[i] = (i * 7) % 128;
  for (double alpha : {0.0, 1e-3}) {
    models::ModelOptions options;
    options.moe_load_balance_coeff = 0.25;
    options.moe_aux_loss_alpha = alpha;
    std::unique_ptr<models::CausalLM> m = models::build_model("deepseek_v3", "debugmodel", 128, 32, options);
    m->init_parameters(5);
    Tensor targets = Tensor::empty({18}, DType::i32);
    for (int i = 0; i < 18; ++i) targets.data<int32_t>()[i] = (i * 7 + 7) % 128;
    const models::TrainingLoss loss = m->training_loss(tokens, targets);
    const bool balance_logged = !loss.terms.empty() && loss.terms[0].first == "moe_aux_loss";
    EXPECT_EQ(balance_logged, alpha > 0);
    if (alpha > 0) EXPECT_NEAR(loss.total.value().item(), loss.cross_entropy + loss.terms[0].second, 1e-6);
    else EXPECT_EQ(loss.total.value().item(), loss.cross_entropy);
    // Every MoE layer (1-5) hands its expert loads to the data-parallel sum, once.
    int summed = 0;
    m->end_step([&](Tensor& t) { EXPECT_EQ(t.numel(), 8); ++summed; });
    EXPECT_EQ(summed, 5);
    int moved = 0;
    for (auto& [name, bias] : m->named_buffers()) {
      if (!name.ends_with("expert_bias")) continue;
      for (int64_t e = 0; e < bias.numel(); ++e) {
        const double b = std::abs(double(bias.data<float>()[e])) / (0.25 / 8);
        EXPECT_NEAR(b, std::round(b), 1e-4) << name << "[" << e << "]";
        EXPECT_LE(b, 16.0) << name << "[" << e << "]";
        moved += b > 0.5;
      }
    }
    EXPECT_GT(moved, 0);
  }
}

// A tiny model memorizes one batch: AdamW over every parameter (MLA's latent norms included)
// drives the loss far below chance, in f32 and with full activation recompute alike.
TEST(DeepSeekV3Model, AdamWStepsFitOneBatch) {
  DeepSeekV3Args a;
  a.vocab_size = 32, a.dim = 32, a.n_layers = 2, a.n_heads = 2, a.inter_dim = 48, a.q_lora_rank = 16;
  a.kv_lora_rank = 16, a.qk_nope_head_dim = 8, a.qk_rope_head_dim = 4, a.v_head_dim = 8;
  Tensor tokens = Tensor::empty({2, 12}, DType::i32), targets = Tensor::empty({24}, DType::i32);
  for (int i = 0; i < 24; ++i) tokens.data<int32_t>()[i] = (i * 5) % 32, targets.data<int32_t>()[i] = (i * 5 + 3) % 32;
  for (models::Recompute rc : {models::Recompute::none, models::Recompute::full}) {
    Transformer model(a);
    model.init_parameters(11);
    model.set_recompute(rc);
    kernels::AdamWParams cfg;
    cfg.lr = 1e-2;
    optim::AdamW opt(model.named_parameters(), cfg);
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      model.zero_grad();
      autograd::Variable loss = autograd::cross_entropy(model.forward(tokens), targets);
      autograd::backward(loss);
      opt.step(cfg.lr, optim::clip_grad_norm(model.named_parameters(), 1.0).scale);
      (step == 0 ? first : last) = loss.value().item();
    }
    EXPECT_NEAR(first, std::log(32.0), 1.0);  // unit-std embeddings and dim^-0.5 output init: near chance
    EXPECT_LT(last, 0.5 * first) << "recompute " << int(rc);
  }
}
