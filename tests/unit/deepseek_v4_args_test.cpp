// DeepSeek-V4's arguments (models/deepseek_v4/args.h): the flavors, transformers' config.json
// read as transformers writes it (tests/fixtures/deepseek_v4_tiny/config.json, saved by
// reference/deepseek_v4_fixture.py through DeepseekV4Config.save_pretrained) and written back, the released checkpoint's legacy keys, and
// the configurations a user gets wrong, each refused naming the key and what works.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "common/error_of.h"
#include "titan/models/deepseek_v4/args.h"

using namespace titan;
using namespace titan::models::deepseek_v4;
using test::error_of;

namespace {

nlohmann::json tiny_config() {
  std::ifstream in("tests/fixtures/deepseek_v4_tiny/config.json");
  EXPECT_TRUE(in.good()) << "run from the repository root";
  return nlohmann::json::parse(in);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(DeepSeekV4Args, FlavorsValidateAndTheDebugModelHasEveryLayerKind) {
  for (const std::string& f : deepseek_v4_flavor_names()) {
    SCOPED_TRACE(f);
    const DeepSeekV4Args a = deepseek_v4_flavor(f);
    EXPECT_EQ(int64_t(a.layer_types.size()), a.n_layers);
  }
  const DeepSeekV4Args d = deepseek_v4_flavor("debugmodel", 2048);
  EXPECT_EQ(d.vocab_size, 2048);
  for (LayerType t : {LayerType::sliding, LayerType::csa, LayerType::hca})
    EXPECT_NE(std::find(d.layer_types.begin(), d.layer_types.end(), t), d.layer_types.end()) << layer_type_name(t);
  for (MlpType t : {MlpType::moe, MlpType::hash_moe})
    EXPECT_NE(std::find(d.mlp_types.begin(), d.mlp_types.end(), t), d.mlp_types.end()) << mlp_type_name(t);
  // V4-Flash's published size: 284B parameters, 13B activated per token.
  const DeepSeekV4Args::ParamCount flash = deepseek_v4_flavor("flash").parameters();
  EXPECT_NEAR(double(flash.total) / 1e9, 284, 8);
  EXPECT_NEAR(double(flash.active) / 1e9, 13, 1.5);
  EXPECT_NE(error_of([] { deepseek_v4_flavor("mini"); }).find("debugmodel, flash, pro"), std::string::npos);
}

TEST(DeepSeekV4Args, ReadsTransformersConfigAndWritesItBack) {
  const DeepSeekV4Args a = args_from_hf_config(tiny_config(), "config.json");
  EXPECT_EQ(a.vocab_size, 1000);
  EXPECT_EQ(a.dim, 32);
  EXPECT_EQ(a.rope_dim, 8);
  EXPECT_EQ(a.csa_ratio, 4);
  EXPECT_EQ(a.hca_ratio, 8);
  EXPECT_EQ(a.sliding_window, 8);
  EXPECT_EQ(a.index_topk, 4);
  EXPECT_DOUBLE_EQ(a.swiglu_limit, 0.1);
  EXPECT_DOUBLE_EQ(a.rope_theta, 10000);
  EXPECT_DOUBLE_EQ(a.compress_rope_theta, 160000);
  EXPECT_TRUE(a.yarn);
  EXPECT_DOUBLE_EQ(a.yarn_factor, 4);
  EXPECT_EQ(a.yarn_original_max_position, 16);
  EXPECT_EQ(a.layer_types, (std::vector<LayerType>{LayerType::sliding, LayerType::csa, LayerType::hca, LayerType::csa,
                                                   LayerType::hca}));
  EXPECT_EQ(a.mlp_types,
            (std::vector<MlpType>{MlpType::hash_moe, MlpType::hash_moe, MlpType::moe, MlpType::moe, MlpType::moe}));
  // YaRN reaches the compressed layers only.
  EXPECT_EQ(a.rope(LayerType::sliding).scaling, kernels::RopeScaling::none);
  EXPECT_EQ(a.rope(LayerType::csa).scaling, kernels::RopeScaling::yarn);
  EXPECT_DOUBLE_EQ(a.rope(LayerType::hca).theta, 160000);

  const DeepSeekV4Args back = args_from_hf_config(hf_config(a), "written");
  EXPECT_EQ(hf_config(back), hf_config(a));
  EXPECT_EQ(back.layer_types, a.layer_types);
  EXPECT_TRUE(back.yarn);
  EXPECT_EQ(back.rope_dim, a.rope_dim);
}

TEST(DeepSeekV4Args, ReadsTheReleasedCheckpointsLegacyKeys) {
  nlohmann::json c = tiny_config();
  c.erase("layer_types");
  c.erase("mlp_layer_types");
  c.erase("compress_rates");
  c["compress_rate_csa"] = 4, c["compress_rate_hca"] = 8, c["num_hash_layers"] = 1;
  c["compress_ratios"] = {0, 4, 8, 4, 8, 0};  // a trailing entry for the MTP layer, as released
  const DeepSeekV4Args a = args_from_hf_config(c, "config.json");
  EXPECT_EQ(a.layer_types, (std::vector<LayerType>{LayerType::sliding, LayerType::csa, LayerType::hca, LayerType::csa,
                                                   LayerType::hca}));
  EXPECT_EQ(a.mlp_types,
            (std::vector<MlpType>{MlpType::hash_moe, MlpType::moe, MlpType::moe, MlpType::moe, MlpType::moe}));
  c["compress_ratios"] = {0, 4, 16, 4, 8};
  EXPECT_TRUE(has(error_of([&] { args_from_hf_config(c, "config.json"); }), "compress_ratios holds 16"));
}

TEST(DeepSeekV4Args, ConfigurationsThatDoNotFitAreRefusedByKey) {
  nlohmann::json c = tiny_config();
  c["layer_types"].erase(c["layer_types"].size() - 1);
  std::string e = error_of([&] { args_from_hf_config(c, "config.json"); });
  EXPECT_TRUE(has(e, "layer_types has 4 entries for num_hidden_layers = 5")) << e;

  c = tiny_config();
  c["layer_types"][1] = "full_attention";
  e = error_of([&] { args_from_hf_config(c, "config.json"); });
  EXPECT_TRUE(has(e, "config.json") && has(e, "full_attention") && has(e, "compressed_sparse_attention")) << e;

  c = tiny_config();
  c["o_groups"] = 3;
  EXPECT_TRUE(has(error_of([&] { args_from_hf_config(c, "config.json"); }), "o_groups = 3"));

  // A sequence shorter than a compressed layer's ratio: that layer would emit no entry.
  const DeepSeekV4Args a = args_from_hf_config(tiny_config(), "config.json");
  e = error_of([&] { a.validate_sequence(6); });
  EXPECT_TRUE(has(e, "training.seq_len = 6") && has(e, "heavily_compressed_attention compress ratio 8") &&
              has(e, "seq_len >= 8"))
      << e;
  e = error_of([&] { a.validate_sequence(200); });
  EXPECT_TRUE(has(e, "exceeds the RoPE tables' 64 positions")) << e;
  EXPECT_EQ(error_of([&] { a.validate_sequence(37); }), "(no error)");
}

// Context parallelism cuts a sequence into 2 cp chunks, each borrowing only from the one before:
// a chunk must hold the window's W - 1 tokens and whole windows of every ratio (debugmodel: W 64,
// CSA 4, HCA 16, so chunks of 64, 128, ...). Otherwise the error names training.seq_len,
// context_parallel_degree and the nearest lengths that work.
TEST(DeepSeekV4Args, ContextParallelChunksMustHoldTheWindowAndWholeEntries) {
  const DeepSeekV4Args a = deepseek_v4_flavor("debugmodel", 256);
  EXPECT_EQ(a.context_parallel_chunks().multiple, 16);
  EXPECT_EQ(a.context_parallel_chunks().minimum, 63);
  for (const auto& [seq, cp] : {std::pair<int64_t, int64_t>{256, 2}, {512, 4}, {384, 2}, {77, 1}})
    EXPECT_EQ(error_of([&] { a.validate_context_parallel(seq, cp); }), "(no error)") << seq << " / " << cp;
  std::string e = error_of([&] { a.validate_context_parallel(128, 2); });  // chunks of 32 < 63
  EXPECT_TRUE(has(e, "training.seq_len = 128 with context_parallel_degree = 2 makes 2 x 2 chunks of 32 tokens") &&
              has(e, "use training.seq_len = 256 or 320"))
      << e;
  e = error_of([&] { a.validate_context_parallel(264, 2); });  // chunks of 66: not whole HCA windows
  EXPECT_TRUE(has(e, "chunks of 66 tokens") && has(e, "a multiple of 16") && has(e, "use training.seq_len = 320 or 384"))
      << e;
  e = error_of([&] { a.validate_context_parallel(258, 2); });  // 4 chunks cannot be equal
  EXPECT_TRUE(has(e, "does not split into 2 x 2 equal chunks") && has(e, "use training.seq_len = 320")) << e;
}
