// [optimizer] name = "Muon" as the trainer runs it: which parameters of every registered model
// family go to Muon and which to AdamW (the vocabulary matrices, norms and other non-matrices to
// AdamW; hidden matrices, routers and routed experts to Muon); Muon and AdamW stepped together
// are each optimizer stepped alone, Muon at its own learning rate; their state round-trips, a
// state lacking one of Muon's buffers changes nothing; and a step allocates no memory.
#include <gtest/gtest.h>

#include <cstring>

#include "titan/core/allocator.h"
#include "titan/core/rng.h"
#include "titan/models/causal_lm.h"
#include "titan/models/family.h"
#include "titan/optim/muon_adamw.h"
#include "titan/optim/param_groups.h"

using namespace titan;

namespace {

struct Small : nn::Module {
  nn::Parameter& embedding = register_parameter("embedding", {50, 8}, nn::Init::normal(0, 0.5));
  nn::Parameter& wq = register_parameter("wq", {8, 8}, nn::Init::normal(0, 0.3));
  nn::Parameter& w1 = register_parameter("w1", {24, 8}, nn::Init::normal(0, 0.3));
  nn::Parameter& experts = register_parameter("experts", {4, 6, 8}, nn::Init::normal(0, 0.3));
  nn::Parameter& norm = register_parameter("norm", {8}, nn::Init::ones(), /*weight_decay=*/false);
  nn::Parameter& head = register_parameter("head", {50, 8}, nn::Init::normal(0, 0.3));
  Small() {
    embedding.vocabulary = head.vocabulary = true;
    experts.routed_expert = true;
  }
};

void fill_grads(nn::Module& m, uint64_t seed) {
  Generator rng(seed);
  for (auto& [name, p] : m.named_parameters()) {
    Tensor& g = p->var.ensure_grad();
    for (int64_t i = 0; i < g.numel(); ++i) g.data<float>()[i] = rng.next_uniform() - 0.5f;
  }
}

std::vector<std::string> names(const std::vector<nn::TrainableParam>& ps) {
  std::vector<std::string> out;
  for (const auto& p : ps) out.push_back(p.name);
  return out;
}

}  // namespace

TEST(MuonGroups, SplitByDeclaredFlagsAndShapes) {
  Small m;
  const optim::MuonParamGroups g = optim::split_muon_groups(nn::trainable_params(m.named_parameters()), m.named_parameters());
  EXPECT_EQ(names(g.muon), (std::vector<std::string>{"wq", "w1", "experts"}));
  EXPECT_EQ(names(g.adamw), (std::vector<std::string>{"embedding", "norm", "head"}));
  const std::string text = optim::describe_muon_groups(g);
  EXPECT_NE(text.find("Muon:  3 tensors, " + std::to_string(64 + 192 + 192) + " elements (wq, w1, experts)"), std::string::npos)
      << text;
  EXPECT_NE(text.find("AdamW: 3 tensors, " + std::to_string(400 + 8 + 400) + " elements"), std::string::npos) << text;
}

// Every family's debug flavor: the token embedding and the output head (any matrix with a
// vocabulary-sized dimension) go to AdamW, as do norms and anything not a matrix; the rest of the
// matrices and the routed experts go to Muon. A family that forgets to declare its head fails here.
TEST(MuonGroups, EveryFamilyKeepsVocabularyMatricesAndNormsOnAdamW) {
  constexpr int64_t kVocab = 1031;  // a prime: no hidden dimension equals it
  for (const models::ModelFamily* f : models::model_families()) {
    std::string flavor;
    for (const std::string& fl : f->flavors())
      if (flavor.empty() && fl.find("debug") != std::string::npos) flavor = fl;
    ASSERT_FALSE(flavor.empty()) << f->name << " has no debug flavor";
    models::ModelOptions options;
    if (f->multi_token_prediction) options.mtp_layers = 1;
    std::unique_ptr<models::CausalLM> model;
    {
      nn::ParametersWithoutStorage no_storage;
      model = f->build(flavor, kVocab, 64, options);
    }
    int muon = 0, experts = 0, routers = 0, vocabulary_on_adamw = 0;
    for (const auto& [name, p] : model->named_parameters()) {
      const Shape s = p->var.shape();
      const bool vocab_matrix = s.size() == 2 && (s[0] == kVocab || s[1] == kVocab);
      const optim::ParamGroup g = optim::muon_param_group(*p);
      if (vocab_matrix || s.size() < 2 || p->bias_table) {
        EXPECT_EQ(g, optim::ParamGroup::adamw) << f->name << ": " << name << " " << s.str();
      } else if (s.size() == 2 || p->routed_expert) {
        EXPECT_EQ(g, optim::ParamGroup::muon) << f->name << ": " << name << " " << s.str();
      }
      muon += g == optim::ParamGroup::muon;
      experts += p->routed_expert && g == optim::ParamGroup::muon;
      routers += name.ends_with(".gate.weight") && g == optim::ParamGroup::muon;
      vocabulary_on_adamw += vocab_matrix && p->vocabulary && g == optim::ParamGroup::adamw;
    }
    EXPECT_GT(muon, 0) << f->name;
    // The embedding and the output head (each family names them its way) are declared
    // vocabulary matrices, and AdamW's.
    EXPECT_EQ(vocabulary_on_adamw, 2) << f->name << ": the embedding and the output head should be AdamW's";
    if (f->routed_experts) {
      EXPECT_GT(experts, 0) << f->name << ": routed experts should be Muon's";
      EXPECT_GT(routers, 0) << f->name << ": routers are matrices, Muon's by the rule";
    }
  }
}

// DeepSeek-V4's split (../shared/reference/v4.md 1.3): AdamW for the embedding, the head, mHC's
// static biases and gating factors, every RMSNorm and the attention sinks, and the compressor's
// position bias (a static bias, 2-D though it is); Muon for the projections, mHC's fn included.
TEST(MuonGroups, DeepSeekV4SplitAsThePaper) {
  const models::ModelFamily* v4 = nullptr;
  for (const models::ModelFamily* f : models::model_families())
    if (f->name == "deepseek_v4") v4 = f;
  ASSERT_NE(v4, nullptr);
  std::unique_ptr<models::CausalLM> model;
  {
    nn::ParametersWithoutStorage no_storage;
    model = v4->build("debugmodel", 1031, 64, models::ModelOptions{});
  }
  int fn = 0, position_bias = 0, sinks = 0, hc_small = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    const optim::ParamGroup g = optim::muon_param_group(*p);
    const std::string leaf = name.substr(name.rfind('.') + 1);
    if (leaf == "fn") {
      EXPECT_EQ(g, optim::ParamGroup::muon) << name;
      ++fn;
    } else if (leaf == "position_bias" || leaf == "sinks" || leaf == "base" || leaf == "scale" ||
               name.find("norm") != std::string::npos) {
      EXPECT_EQ(g, optim::ParamGroup::adamw) << name;
      position_bias += leaf == "position_bias", sinks += leaf == "sinks", hc_small += leaf == "base" || leaf == "scale";
    }
  }
  EXPECT_GT(fn, 0);
  EXPECT_GT(position_bias, 0);
  EXPECT_GT(sinks, 0);
  EXPECT_GT(hc_small, 0);
}

// MuonAdamW is Muon over its group at lr x scale and AdamW over the rest at lr, bit for bit, and
// its steady-state steps allocate nothing (the update matrix and Newton-Schulz's scratch were sized
// up front).
TEST(MuonAdamW, StepsEachGroupWithItsOptimizer) {
  Small a, b;
  a.init_parameters(3);
  b.init_parameters(3);
  optim::MuonConfig mc;
  mc.adjust = optim::MuonLrAdjust::match_rms_adamw;
  kernels::AdamWParams ac{0.01f, 0.9f, 0.95f, 1e-8f, 0.1f};
  optim::MuonAdamW both(optim::split_muon_groups(nn::trainable_params(a.named_parameters()), a.named_parameters()), mc,
                        2.0, ac);
  optim::MuonParamGroups alone = optim::split_muon_groups(nn::trainable_params(b.named_parameters()), b.named_parameters());
  optim::Muon muon(std::move(alone.muon), mc);
  optim::AdamW adamw(std::move(alone.adamw), ac);
  EXPECT_EQ(both.name(), "Muon");
  for (int step = 1; step <= 3; ++step) {
    fill_grads(a, uint64_t(step));
    fill_grads(b, uint64_t(step));
    const int64_t live = memory_stats().live_total;
    memory_reset_peak();
    both.step(0.01f, 0.5f);
    // The first step's GEMMs may set up what the matmul backend keeps per shape; none after it.
    if (step > 1) {
      EXPECT_EQ(memory_stats().peak_total, live) << "step " << step << " allocated memory";
    }
    muon.step(0.02f, 0.5f);
    adamw.step(0.01f, 0.5f);
    const auto pa = a.named_parameters(), pb = b.named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      ASSERT_EQ(std::memcmp(pa[i].second->var.value().data_ptr(), pb[i].second->var.value().data_ptr(),
                            pa[i].second->var.value().nbytes()),
                0)
          << pa[i].first << " step " << step;
  }
}

TEST(MuonAdamW, StateRoundTripsAndABadStateChangesNothing) {
  Small a;
  a.init_parameters(4);
  auto make = [](Small& m) {
    return optim::MuonAdamW(optim::split_muon_groups(nn::trainable_params(m.named_parameters()), m.named_parameters()),
                            optim::MuonConfig{}, 1.0, kernels::AdamWParams{});
  };
  optim::MuonAdamW opt = make(a);
  fill_grads(a, 7);
  opt.step(0.01f);
  const auto state = opt.state_dict();
  const auto shapes = opt.state_shapes();
  ASSERT_EQ(state.size(), shapes.size());
  std::map<std::string, Tensor> saved;
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].first, shapes[i].first);
    EXPECT_EQ(state[i].second.shape(), shapes[i].second) << state[i].first;
    saved[state[i].first] = state[i].second.clone();
  }
  EXPECT_TRUE(saved.count("wq.momentum_buffer") && saved.count("experts.momentum_buffer"));
  EXPECT_TRUE(saved.count("head.exp_avg") && saved.count("norm.exp_avg_sq") && saved.count("step"));
  EXPECT_FALSE(saved.count("wq.exp_avg")) << "a Muon parameter has no AdamW moments";
  EXPECT_EQ(optim::state_key_param("experts.momentum_buffer"), "experts");
  EXPECT_EQ(optim::state_key_param("head.exp_avg_sq"), "head");
  EXPECT_EQ(optim::state_key_param("head.step"), "");

  Small b;
  b.init_parameters(4);
  optim::MuonAdamW fresh = make(b);
  std::map<std::string, Tensor> lacking = saved;
  lacking.erase("w1.momentum_buffer");
  EXPECT_THROW(fresh.load_state_dict(lacking, "test state"), Error);
  for (const auto& [key, t] : fresh.state_dict()) {  // nothing loaded, AdamW's part included
    if (t.dtype() != DType::f32) continue;
    for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.data<float>()[i], 0.0f) << key;
  }
  fresh.load_state_dict(saved, "test state");
  for (const auto& [key, t] : fresh.state_dict())
    ASSERT_EQ(std::memcmp(t.data_ptr(), saved.at(key).data_ptr(), t.nbytes()), 0) << key;
}

// Under FSDP each split matrix gets one owner: the costliest first, to the least loaded rank, so
// four equal matrices go one per rank of four, and one big matrix is balanced by the small ones.
TEST(MuonOwners, BalanceNewtonSchulzCost) {
  EXPECT_EQ(optim::muon_owners({{64, 64}, {64, 64}, {64, 64}, {64, 64}}, 4), (std::vector<int>{0, 1, 2, 3}));
  // [256, 256] costs 64x a [64, 64]: it takes rank 0 alone; the small ones fill rank 1.
  const std::vector<int> owners = optim::muon_owners({{64, 64}, {256, 256}, {64, 64}, {64, 64}}, 2);
  EXPECT_EQ(owners, (std::vector<int>{1, 0, 1, 1}));
  // Wide and tall cost the same (the small side decides).
  EXPECT_EQ(optim::muon_owners({{32, 512}, {512, 32}}, 2), (std::vector<int>{0, 1}));
}
