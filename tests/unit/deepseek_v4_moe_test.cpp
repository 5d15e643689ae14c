// DeepSeek-V4's MoE block (models/deepseek_v4/moe.h: DeepSeek-V3's MoE module as moe_args
// configures it) against transformers'
// DeepseekV4SparseMoeBlock (tests/fixtures/v4_moe.safetensors, made by reference/v4_moe_fixture.py):
// a learned-routing "moe" layer (random e_score_correction_bias that changes choices) and a
// "hash_moe" layer (tid2eid of distinct pairs), sqrtsoftplus scores, 13 tokens of width 16, 8
// experts of width 8, top-2, swiglu_limit 0.8 (about 30% of the gates and 60% of the ups clamped).
// The output and the gradients of a probe loss with respect to the input, the gate, the routed
// experts and the shared expert, each to 1e-5 relative (Frobenius) in f32, after mapping
// transformers' names and layouts onto ours; bf16 compute within its rounding (measured ~6e-3).
// Also the state each routing keeps, and the inputs a caller gets wrong, refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error_of.h"
#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v4/model.h"
#include "titan/models/deepseek_v4/moe.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr const char* kFixture = "tests/fixtures/v4_moe.safetensors";
constexpr int64_t kDim = 16, kWidth = 8, kExperts = 8, kTopK = 2, kVocab = 32;

// The fixture's block as the model's layer 0 ("moe") or 1 ("hash_moe") would build it.
models::moe::MoEArgs fixture_args(v4::MlpType routing) {
  v4::DeepSeekV4Args a;
  a.dim = kDim, a.moe_inter_dim = kWidth, a.n_routed_experts = kExperts, a.n_activated_experts = kTopK;
  a.route_scale = 1.5, a.swiglu_limit = 0.8, a.vocab_size = kVocab;
  a.mlp_types = {v4::MlpType::moe, v4::MlpType::hash_moe};
  return v4::moe_args(a, routing == v4::MlpType::hash_moe ? 1 : 0);
}

// The block on h [T, d] with the tokens' ids [T], as one sequence: [T, d].
Variable run(v4::MoE& moe, const Variable& h, const Tensor& ids = Tensor()) {
  const Variable y = moe.forward_with_aux(autograd::view(h, {1, h.shape()[0], h.shape()[1]}), ids).y;
  return autograd::view(y, h.shape());
}

// transformers' gate_up_proj [E, 2F, d]: rows [0, F) are w1 (gate), [F, 2F) w3 (up).
Tensor gate_rows(const Tensor& gate_up) { return gate_up.narrow(1, 0, kWidth).contiguous(); }
Tensor up_rows(const Tensor& gate_up) { return gate_up.narrow(1, kWidth, kWidth).contiguous(); }

void load_layer(v4::MoE& moe, const checkpoint::SafetensorsFile& golden, const std::string& p) {
  const Tensor gate_up = golden.get(p + "experts.gate_up_proj");
  moe.router.gate.weight.var.mutable_value().copy_(golden.get(p + "gate.weight"));
  moe.experts.w1.var.mutable_value().copy_(gate_rows(gate_up));
  moe.experts.w3.var.mutable_value().copy_(up_rows(gate_up));
  moe.experts.w2.var.mutable_value().copy_(golden.get(p + "experts.down_proj"));
  moe.shared_experts->w1.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.gate_proj.weight"));
  moe.shared_experts->w3.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.up_proj.weight"));
  moe.shared_experts->w2.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.down_proj.weight"));
  if (moe.args().hash_routing) {
    moe.tid2eid.copy_(golden.get(p + "gate.tid2eid"));
  } else {
    moe.expert_bias.copy_(golden.get(p + "gate.e_score_correction_bias"));
  }
}

// The block in its fused form, or composed of small ops ([model] converters grouped_mm_small_ops
// and permute_small_ops).
void check_layer(v4::MlpType routing, autograd::OpForm form = autograd::OpForm::fused) {
  const std::string p = std::string(v4::mlp_type_name(routing)) + ".";
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::MoE moe(fixture_args(routing), 0.02);
  moe.set_forms(form, form);
  load_layer(moe, golden, p);
  Variable h(golden.get("h").clone(), true);
  const Tensor ids = golden.get("ids");

  Variable y = run(moe, h, ids);
  EXPECT_LT(test::relative_error(y.value(), golden.get(p + "out")), 1e-5) << p << "out";

  Variable loss = autograd::sum(autograd::mul(y, Variable(golden.get(p + "probe"))));
  autograd::backward(loss);
  const Tensor d_gate_up = golden.get(p + "grad.experts.gate_up_proj");
  const struct {
    const char* name;
    const Variable& var;
    Tensor want;
  } grads[] = {
      {"h", h, golden.get(p + "grad.h")},
      {"gate.weight", moe.router.gate.weight.var, golden.get(p + "grad.gate.weight")},
      {"experts.w1", moe.experts.w1.var, gate_rows(d_gate_up)},
      {"experts.w3", moe.experts.w3.var, up_rows(d_gate_up)},
      {"experts.w2", moe.experts.w2.var, golden.get(p + "grad.experts.down_proj")},
      {"shared_experts.w1", moe.shared_experts->w1.weight.var, golden.get(p + "grad.shared_experts.gate_proj.weight")},
      {"shared_experts.w3", moe.shared_experts->w3.weight.var, golden.get(p + "grad.shared_experts.up_proj.weight")},
      {"shared_experts.w2", moe.shared_experts->w2.weight.var, golden.get(p + "grad.shared_experts.down_proj.weight")},
  };
  for (const auto& g : grads) {
    ASSERT_TRUE(g.var.grad().defined()) << p << g.name;
    EXPECT_LT(test::relative_error(g.var.grad(), g.want), 1e-5) << p << "grad of " << g.name;
  }
}

}  // namespace

TEST(DeepSeekV4MoE, LearnedRoutingMatchesTransformers) { check_layer(v4::MlpType::moe); }

TEST(DeepSeekV4MoE, HashRoutingMatchesTransformers) { check_layer(v4::MlpType::hash_moe); }

TEST(DeepSeekV4MoE, SmallOpFormsMatchTransformers) {
  check_layer(v4::MlpType::moe, autograd::OpForm::small_ops);
  check_layer(v4::MlpType::hash_moe, autograd::OpForm::small_ops);
}

// Mixed precision: bf16 activations and expert GEMMs (the router stays f32) give transformers' f32
// output and gradients within bf16's rounding; the gradients land in the f32 masters.
TEST(DeepSeekV4MoE, Bf16ComputeStaysNearF32) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::MoE moe(fixture_args(v4::MlpType::hash_moe), 0.02);
  load_layer(moe, golden, "hash_moe.");
  moe.set_compute_dtype(DType::bf16);
  // The block's input is an op's output (the post-attention norm's) in the model: a bf16 gradient.
  Variable h(golden.get("h").clone(), true);
  Variable y = run(moe, autograd::cast(h, DType::bf16), golden.get("ids"));
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_LT(test::relative_error(y.value().to(DType::f32), golden.get("hash_moe.out")), 2e-2);
  Variable loss = autograd::sum(autograd::mul(autograd::cast(y, DType::f32), Variable(golden.get("hash_moe.probe"))));
  autograd::backward(loss);
  EXPECT_LT(test::relative_error(moe.router.gate.weight.var.grad(), golden.get("hash_moe.grad.gate.weight")), 3e-2);
  EXPECT_LT(test::relative_error(moe.experts.w2.var.grad(), golden.get("hash_moe.grad.experts.down_proj")), 3e-2);
  EXPECT_LT(test::relative_error(h.grad(), golden.get("hash_moe.grad.h")), 3e-2);
}

// The state transformers' checkpoints hold: the bias or the table. The expert loads are
// statistics a Hugging Face checkpoint lacks.
TEST(DeepSeekV4MoE, StateHasTheBufferOfItsRouting) {
  v4::MoE learned(fixture_args(v4::MlpType::moe), 0.02), hash(fixture_args(v4::MlpType::hash_moe), 0.02);
  auto names = [](v4::MoE& m) {
    std::string all;
    for (const auto& [name, t] : m.named_buffers(nn::BufferKind::state)) all += name + " " + t.shape().str() + ";";
    return all;
  };
  EXPECT_EQ(names(learned), "expert_bias [8];");
  EXPECT_EQ(names(hash), "tid2eid [32, 2];");
  EXPECT_EQ(hash.named_buffers(nn::BufferKind::step_statistic).size(), 1u);  // tokens_per_expert
  EXPECT_EQ(hash.tid2eid.dtype(), DType::i64);
  // A fresh table spreads the ids over every expert, K distinct ones per id: (v K + j) mod E.
  for (int64_t v = 0; v < kVocab; ++v)
    for (int64_t j = 0; j < kTopK; ++j) ASSERT_EQ(hash.tid2eid.data<int64_t>()[v * kTopK + j], (v * kTopK + j) % kExperts);
  for (nn::Parameter* w : {&hash.experts.w1, &hash.experts.w2, &hash.experts.w3})
    EXPECT_TRUE(w->routed_expert && w->gemm_weight);
  EXPECT_FALSE(hash.router.gate.weight.gemm_weight);  // the router's GEMM runs in f32
}

TEST(DeepSeekV4MoE, BadInputsAreRefusedWithTheFix) {
  v4::MoE hash(fixture_args(v4::MlpType::hash_moe), 0.02);
  const Variable h(Tensor::zeros({3, kDim}, DType::f32));
  std::string e = test::error_of([&] { run(hash, h); });
  EXPECT_NE(e.find("hash_moe layer got no token ids"), std::string::npos) << e;

  Tensor ids = Tensor::zeros({3}, DType::i32);
  ids.data<int32_t>()[1] = int32_t(kVocab);
  e = test::error_of([&] { run(hash, h, ids); });
  EXPECT_NE(e.find("token id 32"), std::string::npos) << e;

  hash.tid2eid.data<int64_t>()[1] = kExperts;  // token 0's second expert
  e = test::error_of([&] { run(hash, h, Tensor::zeros({3}, DType::i32)); });
  EXPECT_NE(e.find("tid2eid[0, 1] = 8"), std::string::npos) << e;

  e = test::error_of([&] { run(hash, h, Tensor::zeros({2}, DType::i32)); });
  EXPECT_NE(e.find("for 3 tokens"), std::string::npos) << e;

  models::moe::MoEArgs bad = fixture_args(v4::MlpType::hash_moe);
  bad.vocab_size = 0;
  EXPECT_NE(test::error_of([&] { v4::MoE m(bad, 0.02); }).find("vocab_size"), std::string::npos);
  bad = fixture_args(v4::MlpType::moe);
  bad.swiglu_limit = 0;
  EXPECT_NE(test::error_of([&] { v4::MoE m(bad, 0.02); }).find("swiglu_limit 0"), std::string::npos);
}

// Aux-loss-free balancing (DeepSeek-V3's, models/moe/moe.h) in the learned layers: after a
// training forward the bias moves toward the underloaded experts; a hash layer has no bias, and
// its end of step only restarts the counts. Both report their loads.
TEST(DeepSeekV4MoE, LearnedLayersBalanceTheirBiasAndHashLayersHaveNone) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::MoE learned(fixture_args(v4::MlpType::moe), 0.02), hash(fixture_args(v4::MlpType::hash_moe), 0.02);
  load_layer(learned, golden, "moe.");
  load_layer(hash, golden, "hash_moe.");
  const Tensor bias = learned.expert_bias.clone();
  const Variable h(golden.get("h").clone(), true);
  run(learned, h, golden.get("ids"));
  run(hash, h, golden.get("ids"));
  const Tensor counts = learned.tokens_per_expert.clone();
  const models::SumOverData one_rank = [](Tensor&) {};
  learned.end_step(one_rank);
  hash.end_step(one_rank);
  const float* c = counts.data<float>();
  double mean = 0;
  for (int64_t e = 0; e < kExperts; ++e) mean += c[e] / double(kExperts);
  int moved = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const double step = double(learned.expert_bias.data<float>()[e]) - double(bias.data<float>()[e]);
    if (c[e] < mean) {
      EXPECT_GT(step, 0) << "expert " << e << " had " << c[e] << " of mean " << mean;
    } else if (c[e] > mean) {
      EXPECT_LT(step, 0) << "expert " << e << " had " << c[e] << " of mean " << mean;
    }
    moved += step != 0;
  }
  EXPECT_GT(moved, 0);
  EXPECT_FALSE(hash.expert_bias.defined());
  for (int64_t e = 0; e < kExperts; ++e) EXPECT_EQ(hash.tokens_per_expert.data<float>()[e], 0.0f);  // restarted
  for (v4::MoE* m : {&learned, &hash}) {
    const models::moe::ExpertLoad load = m->load_stats();
    EXPECT_EQ(load.tokens, 13 * kTopK);  // every (token, choice) of the 13 tokens
    EXPECT_GE(load.imbalance, 1.0);
  }
}

// The [model] keys as the family reads them: moe_load_balance_coeff is the learned layers' bias
// rate (hash layers have none); V3's sequence-wise balance loss is refused, naming the key.
TEST(DeepSeekV4MoE, TheModelKeysOfBalancing) {
  models::ModelOptions o;
  o.moe_load_balance_coeff = 0.25;
  auto model = models::build_model("deepseek_v4", "debugmodel", 260, 64, o);
  auto& v4model = dynamic_cast<v4::Transformer&>(*model);
  for (size_t l = 0; l < v4model.layers.size(); ++l) {
    const models::moe::MoEArgs& a = v4model.layers[l].mlp.args();
    EXPECT_EQ(a.load_balance_coeff, a.hash_routing ? 0.0 : 0.25) << "layer " << l;
    EXPECT_EQ(a.hash_routing, l < 2) << "layer " << l;  // the debug model's first two
  }
  o.moe_aux_loss_alpha = 1e-4;
  const std::string e = test::error_of([&] { models::build_model("deepseek_v4", "debugmodel", 260, 64, o); });
  EXPECT_NE(e.find("model.moe_aux_loss_alpha"), std::string::npos) << e;
}
