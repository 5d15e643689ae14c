#include <gtest/gtest.h>

#include "titan/nn/module.h"

using namespace titan;
using namespace titan::nn;

namespace {

struct Leaf : Module {
  Variable& w;
  Variable& b;
  Leaf()
      : w(register_parameter("weight", {4, 3}, Init::trunc_normal(0.02)).var),
        b(register_parameter("bias", {4}, Init::zeros(), false).var) {
    register_buffer("freqs", Tensor::full({2}, 1.5, DType::f32));
  }
};

struct Tree : Module {
  ModuleList<Leaf>& layers;
  Leaf& out;
  Tree()
      : layers(register_module("layers", std::make_unique<ModuleList<Leaf>>())),
        out(register_module("output", std::make_unique<Leaf>())) {
    layers.append(std::make_unique<Leaf>());
    layers.append(std::make_unique<Leaf>());
  }
};

}  // namespace

TEST(Module, NamesAreDottedPathsInRegistrationOrder) {
  Tree t;
  std::vector<std::string> names;
  for (auto& [n, p] : t.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                                             "output.weight", "output.bias"}));
  EXPECT_EQ(t.num_parameters(), 3 * 16);
  EXPECT_EQ(t.state_dict().size(), 9u);  // 6 parameters + 3 buffers
  EXPECT_FALSE(t.named_parameters()[1].second->weight_decay);
}

TEST(Module, InitDependsOnSeedAndNameOnly) {
  Tree a, b;
  a.init_parameters(7);
  b.init_parameters(7);
  EXPECT_EQ(a.layers[1].w.value().at({2, 1}), b.layers[1].w.value().at({2, 1}));
  EXPECT_NE(a.layers[0].w.value().at({2, 1}), a.layers[1].w.value().at({2, 1}));
  EXPECT_EQ(a.layers[0].b.value().at({3}), 0.0);
  for (int64_t i = 0; i < 12; ++i) EXPECT_LE(std::abs(a.out.w.value().data<float>()[i]), 0.04f);
  b.init_parameters(8);
  EXPECT_NE(a.layers[1].w.value().at({2, 1}), b.layers[1].w.value().at({2, 1}));
}

TEST(Module, LoadStateDictChecksNamesAndShapes) {
  Tree a, b;
  a.init_parameters(1);
  std::map<std::string, Tensor> state;
  for (auto& [n, t] : a.state_dict()) state[n] = t.clone();
  b.load_state_dict(state);
  EXPECT_EQ(b.out.w.value().at({3, 2}), a.out.w.value().at({3, 2}));
  auto bad = state;
  bad["output.weight"] = Tensor::zeros({3, 4}, DType::f32);
  try {
    b.load_state_dict(bad, true, "ckpt/model.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'output.weight' in ckpt/model.safetensors has shape [3, 4]"), std::string::npos)
        << e.what();
  }
  auto missing = state;
  missing.erase("layers.1.bias");
  EXPECT_THROW(b.load_state_dict(missing), Error);
  EXPECT_NO_THROW(b.load_state_dict(missing, false));
  auto extra = state;
  extra["layers.2.weight"] = Tensor::zeros({4, 3}, DType::f32);
  EXPECT_THROW(b.load_state_dict(extra), Error);
}
