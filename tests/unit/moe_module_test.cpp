// MoE routing and the MoE module: group-limited routing on a hand-computed example, the
// expert sort, the module's forward and backward against the double reference composition
// (common/moe_reference.h), mixed precision, parameter names, and aux-loss-free balancing.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include <omp.h>

#include "common/kernel_check.h"
#include "common/moe_reference.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/grouped_matmul.h"
#include "titan/kernels/moe_router.h"
#include "titan/kernels/onednn/matmul.h"
#include "titan/models/moe/moe.h"

using namespace titan;
using namespace titan::test;
using titan::models::moe::MoE;
using titan::models::moe::MoEArgs;

namespace {

Tensor f32(const Shape& s, const std::vector<float>& v) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Doubles doubles_of(const Tensor& t) { return to_doubles(t); }

}  // namespace

// Grouped GEMMs run one expert per thread when the experts' rows deal out evenly over the
// threads, else in order on all threads. Both give the reference's results (the op table checks
// random shapes in whatever mode they fall into; this pins one shape to each mode, with row
// blocks, aligned pieces and padded tails), and repeating the call creates no primitive.
TEST(GroupedMatmul, ExpertParallelAndInOrderMatchReference) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const int64_t n = 24, k = 40;
  const std::vector<int64_t> even = {0, 1100, 1400, 2500, 2800}, skewed = {0, 2700, 2750, 2800, 2800};
  ASSERT_TRUE(kernels::grouped_matmul_runs_experts_in_parallel(even));  // loads 1400 / 1400
  ASSERT_FALSE(kernels::grouped_matmul_runs_experts_in_parallel(skewed));
  for (const auto& offsets : {even, skewed}) {
    for (DType dt : {DType::f32, DType::bf16}) {
      const int64_t m = offsets.back(), e = int64_t(offsets.size()) - 1;
      const Tensor a = random_tensor({m, k}, dt, 1, "a"), w = random_tensor({e, n, k}, dt, 2, "w");
      const Tensor dc = random_tensor({m, n}, dt, 3, "dc");
      auto run = [&] {
        Tensor c = Tensor::empty({m, n}, dt), da = Tensor::zeros({m, k}, dt), dw = Tensor::zeros({e, n, k}, DType::f32);
        kernels::grouped_matmul_forward(c, a, w, offsets);
        kernels::grouped_matmul_backward(da, dw, dc, a, w, offsets);
        return std::vector<Tensor>{c, da, dw};
      };
      const std::vector<Tensor> fast = run();
      const int64_t created = kernels::onednn::matmul_cache_stats().created;
      run();
      EXPECT_EQ(kernels::onednn::matmul_cache_stats().created, created);
      std::vector<Tensor> ref;
      kernels::set_kernel_backend(kernels::KernelBackend::reference);
      ref = run();
      kernels::set_kernel_backend(kernels::KernelBackend::fast);
      const double tol = dt == DType::f32 ? 1e-4 : 3e-2;
      for (size_t i = 0; i < fast.size(); ++i) {
        const Doubles got = doubles_of(fast[i]), want = doubles_of(ref[i]);
        for (size_t j = 0; j < got.size(); ++j) {
          ASSERT_NEAR(got[j], want[j], tol * (1 + std::abs(want[j]))) << "output " << i << " at " << j;
        }
      }
    }
  }
  omp_set_num_threads(saved);
}

// 8 experts in 4 groups of 2, keep 2 groups, top-3, sigmoid, route_norm, scale 2.
// Biased scores s + b per group: g0 {0.9, 0.1} -> 1.0; g1 {0.5, 0.45} -> 0.95; g2 {0.8, 0.3} ->
// 1.1; g3 {0.6, 0.05} -> 0.65. Kept: g2 and g0. Best three of experts 0, 1, 4, 5 by biased
// score: 0 (0.9), 4 (0.8), 5 (0.3). Weights use the unbiased scores.
TEST(MoeRouter, GroupLimitedHandExample) {
  const std::vector<float> biased = {0.9f, 0.1f, 0.5f, 0.45f, 0.8f, 0.3f, 0.6f, 0.05f};
  const std::vector<float> bias = {0.1f, -0.1f, 0.0f, 0.05f, -0.1f, 0.1f, 0.0f, 0.0f};
  std::vector<float> logits(8);
  std::vector<double> score(8);
  for (int i = 0; i < 8; ++i) {
    score[size_t(i)] = double(biased[size_t(i)]) - double(bias[size_t(i)]);  // unbiased sigmoid scores
    logits[size_t(i)] = float(std::log(score[size_t(i)] / (1 - score[size_t(i)])));
  }
  kernels::RouterParams p;
  p.experts = 8, p.top_k = 3, p.score = kernels::RouterScore::sigmoid, p.n_groups = 4, p.topk_groups = 2;
  p.route_norm = true, p.route_scale = 2.0;
  Tensor scores = Tensor::empty({1, 8}, DType::f32), idx = Tensor::empty({1, 3}, DType::i32),
         w = Tensor::empty({1, 3}, DType::f32);
  kernels::moe_router_forward(scores, idx, w, f32({1, 8}, logits), f32({8}, bias), p);
  const int32_t* i = idx.data<int32_t>();
  EXPECT_EQ(i[0], 0);
  EXPECT_EQ(i[1], 4);
  EXPECT_EQ(i[2], 5);
  const double z = score[0] + score[4] + score[5];
  EXPECT_NEAR(w.data<float>()[0], 2.0 * score[0] / z, 1e-6);
  EXPECT_NEAR(w.data<float>()[1], 2.0 * score[4] / z, 1e-6);
  EXPECT_NEAR(w.data<float>()[2], 2.0 * score[5] / z, 1e-6);
  // Without group limits expert 6 (0.6) would beat 5 (0.3).
  p.n_groups = p.topk_groups = 1;
  kernels::moe_router_forward(scores, idx, w, f32({1, 8}, logits), f32({8}, bias), p);
  EXPECT_EQ(idx.data<int32_t>()[2], 6);
}

TEST(MoeRouter, RejectsBadGroups) {
  kernels::RouterParams p;
  p.experts = 8, p.top_k = 6, p.n_groups = 4, p.topk_groups = 2;  // 2 groups of 2 cannot give 6
  EXPECT_THROW(kernels::check_router_params(p), Error);
  p.top_k = 2, p.n_groups = 3;  // 3 does not divide 8
  EXPECT_THROW(kernels::check_router_params(p), Error);
}

TEST(MoeDispatch, StableCountingSort) {
  Tensor idx = Tensor::empty({3, 2}, DType::i32);
  const int32_t c[6] = {1, 0, 1, 2, 0, 1};
  std::copy(c, c + 6, idx.data<int32_t>());
  const kernels::ExpertDispatch d = kernels::moe_sort_by_expert(idx, 4);
  EXPECT_EQ(d.offsets, (std::vector<int64_t>{0, 2, 5, 6, 6}));
  // expert 0: (t0, j1), (t2, j0); expert 1: (t0, j0), (t1, j0), (t2, j1); expert 2: (t1, j1)
  const std::vector<int32_t> want = {2, 0, 3, 5, 1, 4};
  EXPECT_EQ(std::vector<int32_t>(d.pos.data<int32_t>(), d.pos.data<int32_t>() + 6), want);
}

namespace {

MoEArgs tiny_args(bool sigmoid) {
  MoEArgs a;
  a.dim = 16, a.moe_inter_dim = 8, a.n_routed_experts = 8, a.n_activated_experts = 3;
  a.score_func = sigmoid ? kernels::RouterScore::sigmoid : kernels::RouterScore::softmax;
  a.route_norm = sigmoid, a.route_scale = sigmoid ? 2.5 : 1.0;
  a.n_expert_groups = sigmoid ? 4 : 1, a.n_limited_groups = sigmoid ? 2 : 1;
  a.aux_loss_alpha = sigmoid ? 0.01 : 0;
  return a;
}

// The module (f32, no shared experts) against the double reference: output, balance loss and
// every gradient.
void check_module_against_reference(bool sigmoid) {
  MoEArgs a = tiny_args(sigmoid);
  MoE moe(a, 0.05);
  moe.init_parameters(7);
  init_uniform(moe.expert_bias, 3, "bias", -0.02, 0.02);
  const int64_t b = 2, s = 5, t = b * s;
  autograd::Variable x(random_tensor({b, s, a.dim}, DType::f32, 1, "x"), true);
  const Tensor dy = random_tensor({b, s, a.dim}, DType::f32, 1, "dy");

  autograd::TapeScope scope;
  MoE::Output o = moe.forward_with_aux(x);
  // Backward through both outputs: y with dy, the balance loss (when on) with 1.
  if (o.aux_loss.defined()) o.aux_loss.ensure_grad().fill_(1.0);
  autograd::backward(o.y, dy);

  MoeReference r;
  r.dims = {b, s, a.dim, a.moe_inter_dim, a.router_params(), a.aux_loss_alpha};
  r.bias = doubles_of(moe.expert_bias);
  const std::vector<Doubles> in = {doubles_of(x.value().view({t, a.dim})),
                                   doubles_of(moe.router.gate.weight.var.value()),
                                   doubles_of(moe.experts.w1.var.value()), doubles_of(moe.experts.w2.var.value()),
                                   doubles_of(moe.experts.w3.var.value())};
  const std::vector<Doubles> want = r.forward(in);
  std::vector<Doubles> dout = {doubles_of(dy)};
  if (sigmoid) dout.push_back({1.0});
  const std::vector<Doubles> grads = r.backward(in, dout);

  auto expect_close = [](const Doubles& got, const Doubles& ref, const char* what) {
    const ErrorStats e = compare(got, ref, 1e-5, 1e-4);
    EXPECT_LE(e.max_scaled, 1.0) << what << ": max abs error " << e.max_abs << " at " << e.worst;
  };
  expect_close(doubles_of(o.y.value()), want[0], "y");
  if (sigmoid) expect_close(doubles_of(o.aux_loss.value()), want[1], "aux_loss");
  expect_close(doubles_of(x.grad()), grads[0], "dx");
  expect_close(doubles_of(moe.router.gate.weight.var.grad()), grads[1], "d router.gate.weight");
  expect_close(doubles_of(moe.experts.w1.var.grad()), grads[2], "d experts.w1");
  expect_close(doubles_of(moe.experts.w2.var.grad()), grads[3], "d experts.w2");
  expect_close(doubles_of(moe.experts.w3.var.grad()), grads[4], "d experts.w3");
}

}  // namespace

TEST(MoeModule, MatchesReferenceSoftmax) { check_module_against_reference(false); }
TEST(MoeModule, MatchesReferenceSigmoidGroupsAuxLoss) { check_module_against_reference(true); }

TEST(MoeModule, ParameterNames) {
  MoEArgs a = tiny_args(false);
  a.n_shared_experts = 2;
  MoE moe(a, 0.02);
  std::vector<std::string> names;
  for (auto& [n, p] : moe.named_parameters()) names.push_back(n + " " + p->var.shape().str());
  const std::vector<std::string> want = {
      "router.gate.weight [8, 16]",         "experts.w1 [8, 8, 16]",              "experts.w2 [8, 16, 8]",
      "experts.w3 [8, 8, 16]",              "shared_experts.w1.weight [16, 16]", "shared_experts.w2.weight [16, 16]",
      "shared_experts.w3.weight [16, 16]"};
  EXPECT_EQ(names, want);
  std::vector<std::string> buffers;
  for (auto& [n, t] : moe.named_buffers()) buffers.push_back(n);
  EXPECT_EQ(buffers, (std::vector<std::string>{"expert_bias", "tokens_per_expert", "warmup_tokens_per_expert"}));
}

// bf16 compute with f32 masters: the same routed layer within bf16 tolerance of f32, with the
// shared experts added.
TEST(MoeModule, MixedPrecisionTracksF32) {
  MoEArgs a = tiny_args(true);
  a.n_shared_experts = 1;
  MoE moe(a, 0.05);
  moe.init_parameters(11);
  const Tensor x32 = random_tensor({2, 8, a.dim}, DType::f32, 2, "x");
  Tensor y32;
  {
    autograd::NoGradGuard ng;
    y32 = moe.forward_with_aux(autograd::Variable(x32)).y.value().clone();
  }
  moe.set_compute_dtype(DType::bf16);
  autograd::TapeScope scope;
  autograd::Variable x16(x32.to(DType::bf16), true);
  MoE::Output o = moe.forward_with_aux(x16);
  EXPECT_EQ(o.y.dtype(), DType::bf16);
  const ErrorStats e = compare(to_doubles(o.y.value()), to_doubles(y32), 2e-2, 5e-2);
  EXPECT_LE(e.max_scaled, 1.0) << "bf16 output differs from f32 by " << e.max_abs;
  autograd::backward(o.y, Tensor::full(o.y.shape(), 1.0, DType::bf16));
  for (auto& [n, p] : moe.named_parameters()) {
    ASSERT_TRUE(p->var.grad().defined()) << n;
    for (double v : to_doubles(p->var.grad())) ASSERT_TRUE(std::isfinite(v)) << n;
  }
  ASSERT_TRUE(x16.grad().defined());
}

// Tokens that all lean towards experts 0 and 1: the bias update must keep a zero-mean bias and
// spread the load over the iterations.
TEST(MoeModule, LoadBalanceBiasSpreadsSkewedLoad) {
  MoEArgs a = tiny_args(true);
  a.aux_loss_alpha = 0, a.load_balance_coeff = 0.005;
  a.n_expert_groups = a.n_limited_groups = 1;
  MoE moe(a, 0.05);
  moe.init_parameters(5);
  // The gate rows of experts 0 and 1 point along x's common direction.
  float* gate = moe.router.gate.weight.var.mutable_value().data<float>();
  for (int64_t j = 0; j < a.dim; ++j) gate[j] += 0.5f, gate[a.dim + j] += 0.4f;
  Tensor x = random_tensor({4, 32, a.dim}, DType::f32, 9, "x", -0.5, 1.5);
  const int iterations = 300, tail = 50;
  double first = 0, tail_mean = 0;
  for (int it = 0; it < iterations; ++it) {
    {
      autograd::TapeScope scope;  // the recorded backward is discarded
      moe.forward_with_aux(autograd::Variable(x));
    }
    moe.update_load_balance();
    const models::moe::ExpertLoad l = moe.load_stats();
    EXPECT_EQ(l.tokens, 4 * 32 * a.n_activated_experts);
    if (it == 0) first = l.imbalance;
    if (it >= iterations - tail) tail_mean += l.imbalance / tail;
    const float* bias = moe.expert_bias.data<float>();
    EXPECT_NEAR(std::accumulate(bias, bias + a.n_routed_experts, 0.0), 0.0, 1e-5);
  }
  EXPECT_GT(first, 2.0) << "the synthetic input should start skewed";
  // Sign updates keep the load oscillating around balance; its mean over the tail is near 1.
  EXPECT_LT(tail_mean, 1.5) << "the bias update should have spread the load (first imbalance " << first << ")";
  for (int64_t i = 0; i < a.n_routed_experts; ++i) EXPECT_EQ(moe.tokens_per_expert.data<float>()[i], 0.0f);
}

TEST(MoeModule, LoadStatsLogEntries) {
  models::StepStats stats;
  models::moe::ExpertLoad l;
  l.tokens = 40, l.min = 2, l.max = 9, l.imbalance = 1.8;
  models::moe::append_load_stats(stats, 3, l);
  const std::vector<std::pair<std::string, double>> want = {
      {"moe_imbalance/layer3", 1.8}, {"moe_load_min/layer3", 2.0}, {"moe_load_max/layer3", 9.0}};
  EXPECT_EQ(stats.detail, want);
  // The console's summary is the worst layer.
  l.imbalance = 2.5;
  models::moe::append_load_stats(stats, 4, l);
  l.imbalance = 1.1;
  models::moe::append_load_stats(stats, 5, l);
  const std::vector<std::pair<std::string, double>> summary = {{"moe_imbalance_max", 2.5}};
  EXPECT_EQ(stats.summary, summary);
  EXPECT_EQ(stats.detail.size(), 9u);
}

// Activation checkpointing recomputes the layer in backward: same choice, same gradients, and
// the step's tokens counted once.
TEST(MoeModule, CheckpointRecomputeMatches) {
  MoEArgs a = tiny_args(true);
  a.n_shared_experts = 1;
  MoE moe(a, 0.05);
  moe.init_parameters(13);
  const Tensor x0 = random_tensor({2, 5, a.dim}, DType::f32, 4, "x");
  const Tensor dy = random_tensor({2, 5, a.dim}, DType::f32, 4, "dy");
  auto grads = [&](bool checkpointed) {
    moe.zero_grad();
    autograd::TapeScope scope;
    autograd::Variable x(x0, true);
    autograd::Variable y;
    if (checkpointed) {
      y = autograd::checkpoint([&](const std::vector<autograd::Variable>& in) {
            return std::vector<autograd::Variable>{moe.forward_with_aux(in[0]).y};
          }, {x})[0];
    } else {
      y = moe.forward_with_aux(x).y;
    }
    autograd::backward(y, dy);
    std::vector<Doubles> g = {to_doubles(x.grad())};
    for (auto& [n, p] : moe.named_parameters()) g.push_back(to_doubles(p->var.grad()));
    return g;
  };
  const std::vector<Doubles> plain = grads(false);
  const models::moe::ExpertLoad plain_load = moe.load_stats();
  const std::vector<Doubles> recomputed = grads(true);
  const models::moe::ExpertLoad recomputed_load = moe.load_stats();
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(plain[i], recomputed[i]) << "gradient " << i;
  EXPECT_EQ(plain_load.tokens, recomputed_load.tokens);
}

// quantize.grouped_mm (autograd/quantized_grouped_matmul.h) on the fused path: the output moves
// off the f32 one by the recipe's rounding, and the expert weights' gradients of a batch of two
// sequences equal the sum of each sequence's alone (the wgrad tiles restart at each sequence, as
// FSDP's split of the batch needs; with 40 rows over 8 experts a tile would otherwise mix them).
TEST(MoeModule, QuantizedExpertsDoNotDependOnTheBatchSplit) {
  for (autograd::LowPrecision r :
       {autograd::LowPrecision::fp8_blockwise, autograd::LowPrecision::mxfp8, autograd::LowPrecision::mxfp4}) {
    MoEArgs a = tiny_args(false);
    MoE moe(a, 0.05);
    moe.init_parameters(7);
    const int64_t s = 20;
    const Tensor x = random_tensor({2, s, a.dim}, DType::f32, 1, "x"), dy = random_tensor({2, s, a.dim}, DType::f32, 1, "dy");
    const Tensor y32 = moe.forward_with_aux(autograd::Variable(x)).y.value().clone();
    moe.set_quantize(r);
    auto grads = [&](int64_t b0, int64_t b1, bool accumulate) {
      if (!accumulate) moe.zero_grad();
      autograd::TapeScope scope;
      MoE::Output o = moe.forward_with_aux(autograd::Variable(x.slice(0, b0, b1).contiguous()));
      autograd::backward(o.y, dy.slice(0, b0, b1).contiguous());
      return o.y.value().clone();
    };
    const Tensor y = grads(0, 2, false);
    double num = 0, den = 0;  // ||y - y32|| / ||y32||: the experts ran quantized, within the formats' rounding
    for (int64_t i = 0; i < y.numel(); ++i) {
      const double d = double(y.data<float>()[i]) - double(y32.data<float>()[i]);
      num += d * d, den += double(y32.data<float>()[i]) * double(y32.data<float>()[i]);
    }
    EXPECT_GT(std::sqrt(num / den), 1e-3) << int(r);
    EXPECT_LT(std::sqrt(num / den), 0.3) << int(r);
    std::vector<Doubles> whole;
    for (auto* w : {&moe.experts.w1, &moe.experts.w2, &moe.experts.w3}) whole.push_back(to_doubles(w->var.grad()));
    grads(0, 1, false);
    grads(1, 2, true);
    int i = 0;
    for (auto* w : {&moe.experts.w1, &moe.experts.w2, &moe.experts.w3}) {
      const ErrorStats e = compare(to_doubles(w->var.grad()), whole[size_t(i++)], 1e-6, 1e-5);
      EXPECT_LE(e.max_scaled, 1.0) << int(r) << " w" << i << ": max abs error " << e.max_abs;
    }
  }
}
