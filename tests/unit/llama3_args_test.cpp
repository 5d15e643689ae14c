#include <gtest/gtest.h>

#include "titan/models/llama3/args.h"
#include "titan/models/llama3/hf_adapter.h"
#include "titan/models/llama3/model.h"

using namespace titan;
using namespace titan::models::llama3;

TEST(Llama3Args, FlavorShapesAndParameterCounts) {
  const Llama3Args b8 = llama3_flavor("8B");
  EXPECT_EQ(b8.ffn_hidden(), 14336);
  EXPECT_NEAR(double(b8.num_parameters()), 8.03e9, 0.01e9);
  EXPECT_NEAR(double(llama3_flavor("70B").num_parameters()), 70.55e9, 0.1e9);
  EXPECT_NEAR(double(llama3_flavor("405B").num_parameters()), 405.9e9, 0.5e9);
  const Llama3Args m125 = llama3_flavor("125M", 2048);
  EXPECT_EQ(m125.dim, 768);
  EXPECT_EQ(m125.n_layers, 12);
  EXPECT_EQ(m125.vocab_size, 2048);
  EXPECT_THROW(llama3_flavor("7B"), Error);
  Llama3Args bad = m125;
  bad.n_heads = 7;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(Llama3Args, ModuleParametersMatchTheAnalyticCount) {
  Llama3Args a = llama3_flavor("debugmodel", 500);
  Transformer m(a);
  EXPECT_EQ(m.num_parameters(), a.num_parameters());
  // Every parameter has a Hugging Face name, and the mapping inverts.
  for (auto& [name, p] : m.named_parameters()) {
    const auto hf = to_hf_name(name);
    ASSERT_TRUE(hf.has_value()) << name;
    EXPECT_EQ(from_hf_name(*hf), name);
  }
  EXPECT_EQ(to_hf_name("layers.11.feed_forward.w3.weight"), "model.layers.11.mlp.up_proj.weight");
  EXPECT_FALSE(to_hf_name("layers.x.attention.wq.weight").has_value());
  EXPECT_FALSE(from_hf_name("model.layers.0.self_attn.rotary_emb.inv_freq").has_value());
}
