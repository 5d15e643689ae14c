// DeepSeek-V4's MoE block (models/deepseek_v4/moe.h) against transformers'
// DeepseekV4SparseMoeBlock (tests/fixtures/v4_moe.safetensors, made by reference/v4_moe_fixture.py):
// a learned-routing "moe" layer (random e_score_correction_bias that changes choices) and a
// "hash_moe" layer (tid2eid of distinct pairs), sqrtsoftplus scores, 13 tokens of width 16, 8
// experts of width 8, top-2, swiglu_limit 0.8 (about 30% of the gates and 60% of the ups clamped).
// The output and the gradients of a probe loss with respect to the input, the gate, the routed
// experts and the shared expert, each to 1e-5 relative (Frobenius) in f32, after mapping
// transformers' names and layouts onto ours; bf16 compute within its rounding (measured ~6e-3).
// Also the inputs a caller gets wrong, refused.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error_of.h"
#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v4/moe.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr const char* kFixture = "tests/fixtures/v4_moe.safetensors";
constexpr int64_t kDim = 16, kWidth = 8, kExperts = 8, kTopK = 2, kVocab = 32;

v4::MoEArgs fixture_args(v4::MoERouting routing) {
  v4::MoEArgs a;
  a.dim = kDim, a.moe_intermediate_size = kWidth, a.n_routed_experts = kExperts, a.num_experts_per_tok = kTopK;
  a.routed_scaling_factor = 1.5, a.swiglu_limit = 0.8, a.vocab_size = kVocab, a.routing = routing;
  return a;
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
  moe.shared_experts.w1.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.gate_proj.weight"));
  moe.shared_experts.w3.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.up_proj.weight"));
  moe.shared_experts.w2.weight.var.mutable_value().copy_(golden.get(p + "shared_experts.down_proj.weight"));
  if (moe.args().routing == v4::MoERouting::hash) {
    moe.tid2eid.copy_(golden.get(p + "gate.tid2eid"));
  } else {
    moe.expert_bias.copy_(golden.get(p + "gate.e_score_correction_bias"));
  }
}

void check_layer(v4::MoERouting routing) {
  const std::string p = std::string(v4::layer_type_name(routing)) + ".";
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::MoE moe(fixture_args(routing));
  load_layer(moe, golden, p);
  Variable h(golden.get("h").clone(), true);
  const Tensor ids = golden.get("ids");

  Variable y = moe.forward(h, ids);
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
      {"shared_experts.w1", moe.shared_experts.w1.weight.var, golden.get(p + "grad.shared_experts.gate_proj.weight")},
      {"shared_experts.w3", moe.shared_experts.w3.weight.var, golden.get(p + "grad.shared_experts.up_proj.weight")},
      {"shared_experts.w2", moe.shared_experts.w2.weight.var, golden.get(p + "grad.shared_experts.down_proj.weight")},
  };
  for (const auto& g : grads) {
    ASSERT_TRUE(g.var.grad().defined()) << p << g.name;
    EXPECT_LT(test::relative_error(g.var.grad(), g.want), 1e-5) << p << "grad of " << g.name;
  }
}

}  // namespace

TEST(DeepSeekV4MoE, LearnedRoutingMatchesTransformers) { check_layer(v4::MoERouting::learned); }

TEST(DeepSeekV4MoE, HashRoutingMatchesTransformers) { check_layer(v4::MoERouting::hash); }

// Mixed precision: bf16 activations and expert GEMMs (the router stays f32) give transformers' f32
// output and gradients within bf16's rounding; the gradients land in the f32 masters.
TEST(DeepSeekV4MoE, Bf16ComputeStaysNearF32) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::MoE moe(fixture_args(v4::MoERouting::hash));
  load_layer(moe, golden, "hash_moe.");
  moe.set_compute_dtype(DType::bf16);
  // The block's input is an op's output (the post-attention norm's) in the model: a bf16 gradient.
  Variable h(golden.get("h").clone(), true);
  Variable y = moe.forward(autograd::cast(h, DType::bf16), golden.get("ids"));
  ASSERT_EQ(y.dtype(), DType::bf16);
  EXPECT_LT(test::relative_error(y.value().to(DType::f32), golden.get("hash_moe.out")), 2e-2);
  Variable loss = autograd::sum(autograd::mul(autograd::cast(y, DType::f32), Variable(golden.get("hash_moe.probe"))));
  autograd::backward(loss);
  EXPECT_LT(test::relative_error(moe.router.gate.weight.var.grad(), golden.get("hash_moe.grad.gate.weight")), 3e-2);
  EXPECT_LT(test::relative_error(moe.experts.w2.var.grad(), golden.get("hash_moe.grad.experts.down_proj")), 3e-2);
  EXPECT_LT(test::relative_error(h.grad(), golden.get("hash_moe.grad.h")), 3e-2);
}

TEST(DeepSeekV4MoE, StateHasTheBufferOfItsRouting) {
  v4::MoE learned(fixture_args(v4::MoERouting::learned)), hash(fixture_args(v4::MoERouting::hash));
  auto names = [](v4::MoE& m) {
    std::string all;
    for (const auto& [name, t] : m.named_buffers()) all += name + " " + t.shape().str() + ";";
    return all;
  };
  EXPECT_EQ(names(learned), "expert_bias [8];");
  EXPECT_EQ(names(hash), "tid2eid [32, 2];");
  EXPECT_EQ(hash.tid2eid.dtype(), DType::i64);
  for (nn::Parameter* w : {&hash.experts.w1, &hash.experts.w2, &hash.experts.w3})
    EXPECT_TRUE(w->routed_expert && w->gemm_weight);
  EXPECT_FALSE(hash.router.gate.weight.gemm_weight);  // the router's GEMM runs in f32
}

TEST(DeepSeekV4MoE, BadInputsAreRefusedWithTheFix) {
  v4::MoE hash(fixture_args(v4::MoERouting::hash));
  const Variable h(Tensor::zeros({3, kDim}, DType::f32));
  std::string e = test::error_of([&] { hash.forward(h); });
  EXPECT_NE(e.find("hash_moe layer got no token ids"), std::string::npos) << e;

  Tensor ids = Tensor::zeros({3}, DType::i32);
  ids.data<int32_t>()[1] = int32_t(kVocab);
  e = test::error_of([&] { hash.forward(h, ids); });
  EXPECT_NE(e.find("token id 32"), std::string::npos) << e;

  hash.tid2eid.data<int64_t>()[1] = kExperts;  // token 0's second expert
  e = test::error_of([&] { hash.forward(h, Tensor::zeros({3}, DType::i32)); });
  EXPECT_NE(e.find("tid2eid[0, 1] = 8"), std::string::npos) << e;

  v4::MoE learned(fixture_args(v4::MoERouting::learned));
  e = test::error_of([&] { learned.forward(Variable(Tensor::zeros({1, 3, kDim}, DType::f32))); });
  EXPECT_NE(e.find("[T, 16]"), std::string::npos) << e;

  v4::MoEArgs bad = fixture_args(v4::MoERouting::hash);
  bad.vocab_size = 0;
  EXPECT_NE(test::error_of([&] { v4::MoE m(bad); }).find("vocab_size"), std::string::npos);
  bad = fixture_args(v4::MoERouting::learned);
  bad.scoring_func = kernels::RouterScore::softmax;
  EXPECT_NE(test::error_of([&] { v4::MoE m(bad); }).find("sqrtsoftplus"), std::string::npos);
}
