// Hugging Face interop for DeepSeek-V3 with tiny folders written by the test: FP8 128x128 block
// dequantization (ragged edges), sharded export + index and import, MoE name mapping with
// stacked experts, the published 671B config.json, every error case (naming tensor and file),
// and `titan ckpt convert` both ways, including folders transformers' save_pretrained wrote with
// and without DeepSeek's MTP layer (reference/deepseek_v3_saved.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <tuple>

#include "common/error_of.h"
#include "common/kernel_check.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/cli/ckpt_cli.h"
#include "titan/checkpoint/hf.h"
#include "titan/models/deepseek_v3/hf_adapter.h"

using namespace titan;
using namespace titan::models::deepseek_v3;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A fresh folder under /tmp, removed (with everything in it) when the test ends.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(fs::temp_directory_path() / ("titan_dsv3_hf_" + std::to_string(getpid()) + "_" + name)) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  operator const fs::path&() const { return path_; }
  fs::path operator/(const std::string& rel) const { return path_ / rel; }
  std::string string() const { return path_.string(); }

 private:
  fs::path path_;
};

void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

DeepSeekV3Args tiny_args() {
  DeepSeekV3Args a;
  a.vocab_size = 40, a.dim = 16, a.n_layers = 2, a.n_dense_layers = 2, a.n_heads = 2, a.inter_dim = 24;
  a.q_lora_rank = 8, a.kv_lora_rank = 8, a.qk_nope_head_dim = 4, a.qk_rope_head_dim = 4, a.v_head_dim = 4;
  a.moe_inter_dim = 8, a.n_routed_experts = 3, a.n_shared_experts = 1, a.n_activated_experts = 2;
  a.n_expert_groups = 1, a.n_limited_groups = 1;
  return a;
}

std::vector<std::pair<std::string, Tensor>> random_state(const DeepSeekV3Args& a, uint64_t seed) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, shape] : state_shapes(a)) out.emplace_back(name, test::random_tensor(shape, DType::f32, seed, name));
  return out;
}

using test::error_of;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// A safetensors file with one tensor of a dtype our writer cannot produce.
void write_raw_safetensors(const fs::path& p, const std::string& name, const std::string& dtype, int64_t bytes) {
  std::string header = json{{name, {{"dtype", dtype}, {"shape", {bytes / 8}}, {"data_offsets", {0, bytes}}}}}.dump();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::ofstream f(p, std::ios::binary);
  const uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header << std::string(size_t(bytes), '\0');
}

}  // namespace

TEST(HfFp8, BlockDequantizationMatchesTheOriginalWithinFp8Error) {
  // 300 x 200: the last block row holds 44 rows and the last block column 72 columns.
  const Tensor w = test::random_tensor({300, 200}, DType::f32, 11, "w", -3, 3);
  Tensor wv = w.clone();
  for (int64_t c = 0; c < 200; ++c) wv.data<float>()[5 * 200 + c] *= 1e-3f;  // tiny values in a big block
  auto [q, scale] = checkpoint::quantize_fp8_blocks(wv);
  EXPECT_EQ(scale.shape(), Shape({3, 2}));
  const TempDir dir("fp8");
  write_json(dir / "config.json", {{"quantization_config", {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}}}});
  checkpoint::save_safetensors(dir / "model.safetensors", {{"w", q}, {"w_scale_inv", scale}, {"norm", w.slice(0, 0, 1).contiguous()}});
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  const Tensor got = folder.load_f32("w");
  ASSERT_EQ(got.dtype(), DType::f32);
  const float* g = got.data<float>();
  const float* x = wv.data<float>();
  const float* s = scale.data<float>();
  for (int64_t r = 0; r < 300; ++r)
    for (int64_t c = 0; c < 200; ++c) {
      const float sc = s[(r / 128) * 2 + c / 128];
      // e4m3: 3 mantissa bits (half an ulp is 2^-4 relative) and subnormal steps of 2^-9 (times the scale).
      const double tol = std::fabs(x[r * 200 + c]) / 16 + sc * std::ldexp(1.0, -10) + 1e-12;
      ASSERT_LE(std::fabs(g[r * 200 + c] - x[r * 200 + c]), tol) << r << ", " << c;
      ASSERT_EQ(g[r * 200 + c], f8e4m3_to_f32(q.data<f8e4m3>()[r * 200 + c]) * sc);  // exactly fp8 * scale
    }
  // A block's largest value is represented to within its rounding (the scale maps it to 448).
  EXPECT_NEAR(g[299 * 200 + 199], x[299 * 200 + 199], std::fabs(x[299 * 200 + 199]) / 16 + 1e-6);
  // Scales of the wrong shape, and a missing scale, name the tensor and the file.
  expect_contains(error_of([&] { checkpoint::dequantize_blocks(q, scale.slice(1, 0, 1).contiguous(), "w in x"); }),
                  "do not fit 128x128 blocks");
  checkpoint::save_safetensors(dir / "model.safetensors", {{"w", q}});
  const std::string e = error_of([&] { checkpoint::HfFolder::open(dir).load_f32("w"); });
  expect_contains(e, "'w'");
  expect_contains(e, "model.safetensors");
  expect_contains(e, "w_scale_inv");
}

// DeepSeek-V4's release: "<X>.weight" in FP4 (two e2m1 codes per int8 byte, the low nibble the
// even column) or FP8 with "<X>.scale" UE8M0 block scales beside it.
TEST(HfFp4, PackedBytesAndUe8m0ScalesDequantizeByTheGrid) {
  // Row 0: bytes 0x21 0x9f 0x07 0x70 = codes 1 2 | 15 9 | 7 0 | 0 7 = 0.5 1 | -6 -0.5 | 6 0 | 0 6.
  // Row 1: all 0x44 = 2.0 everywhere. Scales [2, 2] (1 x 4 blocks): e8m0 bytes 128 = 2, 126 = 0.5,
  // 127 = 1, 0 = 2^-127.
  Tensor bytes = Tensor::empty({2, 4}, DType::u8);
  const uint8_t b[8] = {0x21, 0x9f, 0x07, 0x70, 0x44, 0x44, 0x44, 0x44};
  std::memcpy(bytes.data_ptr(), b, 8);
  Tensor scale = Tensor::empty({2, 2}, DType::u8);
  const uint8_t sb[4] = {128, 126, 127, 0};
  std::memcpy(scale.data_ptr(), sb, 4);
  const TempDir dir("fp4");
  write_json(dir / "config.json", json::object());
  Tensor fp8 = Tensor::empty({2, 2}, DType::f8e4m3);
  for (int i = 0; i < 4; ++i) fp8.data<f8e4m3>()[i] = f32_to_f8e4m3(float(i) - 1.5f);
  Tensor fp8_scale = Tensor::empty({1, 1}, DType::e8m0);
  fp8_scale.data<e8m0>()[0] = f32_to_e8m0(4.0f);
  checkpoint::save_safetensors(dir / "model.safetensors", {{"e.weight", bytes}, {"e.scale", scale},
                                                           {"a.weight", fp8}, {"a.scale", fp8_scale},
                                                           {"hc.scale", Tensor::full({3}, 1.0, DType::f32)}});
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  EXPECT_TRUE(folder.is_scale("e.scale"));
  EXPECT_FALSE(folder.is_scale("hc.scale"));  // mHC's own scale: no weight beside it
  const double tiny = std::ldexp(1.0, -126);  // 2 x 2^-127
  EXPECT_EQ(test::to_doubles(folder.load_f32("e.weight")),
            (std::vector<double>{1, 2, -12, -1, 3, 0, 0, 3, 2, 2, 2, 2, tiny, tiny, tiny, tiny}));
  EXPECT_EQ(test::to_doubles(folder.load_f32("a.weight")), (std::vector<double>{-6, -2, 2, 6}));
  // A grid that does not divide the weight evenly names the tensor.
  const Tensor three = Tensor::zeros({2, 3}, DType::u8);
  expect_contains(error_of([&] { checkpoint::dequantize_blocks(checkpoint::unpack_fp4_bytes(bytes, "e"), three, "e in x", 0); }),
                  "do not fit even blocks");
}

TEST(HfAdapter, ShardedExportRoundTripsThroughLoad) {
  const DeepSeekV3Args a = tiny_args();
  const auto state = random_state(a, 3);
  const TempDir dir("sharded");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  opt.max_shard_bytes = 4000;  // forces several shards
  save_hf(dir, a, state, opt);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  const json index = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["model.layers.1.self_attn.kv_b_proj.weight"].get<std::string>().substr(0, 6), "model-");
  std::unique_ptr<Transformer> model = load_hf_model(dir);
  EXPECT_EQ(model->args().q_lora_rank, 8);
  const auto loaded = model->state_dict();
  ASSERT_EQ(loaded.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    ASSERT_EQ(loaded[i].first, state[i].first);
    EXPECT_EQ(test::to_doubles(loaded[i].second), test::to_doubles(state[i].second)) << state[i].first;
  }
  // bf16 export (the default) rounds each value once.
  const TempDir bf("bf16");
  save_hf(bf, a, state);
  const checkpoint::HfFolder f = checkpoint::HfFolder::open(bf);
  EXPECT_EQ(f.config()["torch_dtype"], "bfloat16");
  EXPECT_EQ(test::to_doubles(f.load_f32("lm_head.weight")), test::to_doubles(state.back().second.to(DType::bf16)));
  // A shard that went missing is named with a tensor it holds.
  const std::string shard = index["weight_map"]["lm_head.weight"];
  fs::remove(dir / shard);
  const std::string e = error_of([&] { checkpoint::HfFolder::open(dir); });
  expect_contains(e, shard);
  expect_contains(e, "missing");
}

// An FP8 checkpoint as DeepSeek publishes it: projections in e4m3 with block scales (here with
// 16x16 blocks, from quantization_config, so the tiny matrices have several blocks and ragged
// edges), embeddings and norms in bf16, spread over shards so that scales may sit in another
// shard than their weight.
TEST(HfAdapter, Fp8ShardedCheckpointLoadsIntoTheModel) {
  const DeepSeekV3Args a = tiny_args();
  const auto state = random_state(a, 8);
  std::vector<std::pair<std::string, Tensor>> hf;
  for (const auto& [name, t] : to_hf_tensors(state, a)) {
    if (t.dim() == 2 && name.find("proj") != std::string::npos) {
      auto [q, scale] = checkpoint::quantize_fp8_blocks(t, 16);
      hf.emplace_back(name, q);
      hf.emplace_back(name + "_scale_inv", scale);
    } else {
      hf.emplace_back(name, t.to(DType::bf16));
    }
  }
  json config = hf_config_from_args(a);
  config["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {16, 16}}};
  const TempDir dir("fp8_model");
  checkpoint::HfWriteOptions opt;
  opt.max_shard_bytes = 700;
  checkpoint::save_hf_folder(dir, config, hf, opt);
  ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
  std::unique_ptr<Transformer> model = load_hf_model(dir);
  const auto loaded = model->state_dict();
  int fp8_tensors = 0;
  for (size_t i = 0; i < state.size(); ++i) {
    const std::string hf_name = hf_names(state[i].first, a)[0];
    const bool fp8 = hf_name.find("proj") != std::string::npos;
    fp8_tensors += fp8;
    const std::vector<double> got = test::to_doubles(loaded[i].second), want = test::to_doubles(state[i].second);
    for (size_t j = 0; j < got.size(); ++j)  // e4m3 keeps 3 mantissa bits, bf16 keeps 8
      ASSERT_NEAR(got[j], want[j], std::fabs(want[j]) / (fp8 ? 16 : 256) + (fp8 ? 1e-3 : 0)) << state[i].first;
  }
  EXPECT_GT(fp8_tensors, 10);
}

TEST(HfAdapter, MoeNamesMapToStackedExperts) {
  DeepSeekV3Args a = tiny_args();
  a.n_dense_layers = 1;  // layer 1 is MoE
  const auto state = random_state(a, 4);
  const auto hf = to_hf_tensors(state, a);
  std::map<std::string, Tensor> by_name(hf.begin(), hf.end());
  for (const char* n : {"model.layers.1.mlp.experts.2.down_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight",
                        "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
                        "model.layers.1.mlp.shared_experts.up_proj.weight", "model.layers.0.mlp.up_proj.weight"})
    EXPECT_TRUE(by_name.count(n)) << n;
  EXPECT_EQ(by_name.at("model.layers.1.mlp.experts.2.down_proj.weight").shape(), Shape({16, 8}));
  const TempDir dir("moe");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  save_hf(dir, a, state, opt);
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  EXPECT_EQ(args_from_hf_config(folder.config(), "t").n_dense_layers, 1);
  const std::map<std::string, Tensor> back = load_hf_state(folder, a, state_shapes(a));
  for (const auto& [name, t] : state) EXPECT_EQ(test::to_doubles(back.at(name)), test::to_doubles(t)) << name;
  // Without a MoE layer the model cannot hold this checkpoint, and says so.
  expect_contains(error_of([&] { load_hf_model(dir); }), "MoE");
}

// `--quantize fp8`: DeepSeek's own layout. Every projection of the blocks (experts included) is
// E4M3 beside an f32 "_scale_inv" per 128 x 128 block; the router, norms, embedding and head stay
// in the export dtype; the folder loads back to exactly the blocks' dequantized values.
TEST(HfAdapter, Fp8ExportIsDeepSeeksLayout) {
  DeepSeekV3Args a = tiny_args();
  a.n_dense_layers = 1;  // layer 1 is MoE: its experts are FP8 too
  const auto state = random_state(a, 5);
  const TempDir dir("fp8_export");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  opt.quantize = checkpoint::HfQuantization::fp8;
  save_hf(dir, a, state, opt);
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  EXPECT_EQ(folder.config().at("quantization_config").at("weight_block_size"), json({128, 128}));
  const auto stored = [&](const std::string& n) {
    return checkpoint::SafetensorsFile::open(dir / folder.file_of(n)).entries().at(n).dtype;
  };
  for (const char* n : {"model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
                        "model.layers.1.mlp.experts.1.down_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"}) {
    EXPECT_EQ(stored(n), DType::f8e4m3) << n;
    EXPECT_EQ(stored(n + std::string("_scale_inv")), DType::f32) << n;
  }
  for (const char* n : {"model.layers.1.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                        "model.layers.0.input_layernorm.weight"}) {
    EXPECT_EQ(stored(n), DType::f32) << n;
    EXPECT_FALSE(folder.contains(n + std::string("_scale_inv"))) << n;
  }
  int fp8 = 0;
  const std::map<std::string, Tensor> back = load_hf_state(folder, a, state_shapes(a));
  for (const auto& [hf_name, t] : to_hf_tensors(state, a)) {
    if (stored(hf_name) != DType::f8e4m3) continue;
    ++fp8;
    auto [q, scale] = checkpoint::quantize_fp8_blocks(t);
    EXPECT_EQ(test::to_doubles(folder.load_f32(hf_name)),
              test::to_doubles(checkpoint::dequantize_blocks(q, scale, hf_name)))
        << hf_name;
  }
  EXPECT_GT(fp8, 10);
  EXPECT_EQ(back.size(), state.size());
  // FP4 is V4's layout only.
  checkpoint::HfWriteOptions fp4 = opt;
  fp4.quantize = checkpoint::HfQuantization::fp8_fp4;
  expect_contains(error_of([&] { save_hf(dir / "fp4", a, state, fp4); }), "--quantize fp8");
}

TEST(HfAdapter, PublishedDeepSeekV3ConfigGivesThe671BArchitecture) {
  // The keys of deepseek-ai/DeepSeek-V3's config.json.
  const json c = json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8,
    "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}, "tie_word_embeddings": false,
    "attention_bias": false, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]}})");
  const DeepSeekV3Args a = args_from_hf_config(c, "config.json");
  const DeepSeekV3Args want = deepseek_v3_flavor("671B");
  EXPECT_EQ(a.parameters().total, want.parameters().total);
  EXPECT_EQ(a.parameters().active, want.parameters().active);
  EXPECT_EQ(a.score_func, ScoreFunc::sigmoid);
  EXPECT_EQ(a.max_seq_len, 163840);
  EXPECT_NEAR(a.softmax_scale(), want.softmax_scale(), 1e-12);
  // And back: our config reads to the same args.
  const DeepSeekV3Args again = args_from_hf_config(hf_config_from_args(a), "ours");
  EXPECT_EQ(again.parameters().total, a.parameters().total);
  EXPECT_EQ(again.n_dense_layers, 3);
  EXPECT_NEAR(again.softmax_scale(), a.softmax_scale(), 1e-15);
  // transformers >= 5 writes "rope_parameters" (rope_theta inside); same architecture.
  json v5 = c;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40.0},
                           {"original_max_position_embeddings", 4096}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  EXPECT_NEAR(args_from_hf_config(v5, "v5").softmax_scale(), a.softmax_scale(), 1e-15);
}

TEST(HfAdapter, ErrorsNameTheKeyTensorAndFile) {
  const DeepSeekV3Args a = tiny_args();
  json config = hf_config_from_args(a);
  config.erase("kv_lora_rank");
  expect_contains(error_of([&] { args_from_hf_config(config, "cfg.json"); }), "cfg.json: config key 'kv_lora_rank' is missing");
  config = hf_config_from_args(a);
  config["rope_scaling"]["mscale_all_dim"] = 0.5;
  expect_contains(error_of([&] { args_from_hf_config(config, "cfg.json"); }), "mscale_all_dim");
  config = hf_config_from_args(a);
  config["rope_interleave"] = false;
  expect_contains(error_of([&] { args_from_hf_config(config, "cfg.json"); }), "rope_interleave");
  config = hf_config_from_args(a);
  config["num_hidden_layers"] = "two";
  expect_contains(error_of([&] { args_from_hf_config(config, "cfg.json"); }), "'num_hidden_layers' must be an integer");

  // Wrong shape: names the HF tensor, its file and both shapes.
  auto state = random_state(a, 5);
  for (auto& [name, t] : state)
    if (name == "layers.1.attention.wkv_b.weight") t = test::random_tensor({t.size(0), t.size(1) + 1}, DType::f32, 1, "x");
  const TempDir dir("errors");
  save_hf(dir, a, state);
  std::string e = error_of([&] { load_hf_model(dir); });
  expect_contains(e, "model.layers.1.self_attn.kv_b_proj.weight");
  expect_contains(e, "model.safetensors");
  expect_contains(e, "[16, 8]");

  // The MTP layer (model.layers.<num_hidden_layers>.*) is not part of the model and is skipped:
  // the model has no MTP module and every tensor it has is the folder's (bf16, as written).
  state = random_state(a, 5);
  auto hf = to_hf_tensors(state, a);
  hf.emplace_back("model.layers.2.eh_proj.weight", test::random_tensor({16, 32}, DType::f32, 1, "mtp"));
  checkpoint::save_hf_folder(dir, hf_config_from_args(a), hf);
  {
    const std::unique_ptr<Transformer> skipped = load_hf_model(dir);
    EXPECT_EQ(skipped->args().num_mtp_layers, 0);
    const auto loaded = skipped->state_dict();
    ASSERT_EQ(loaded.size(), state.size());
    for (size_t i = 0; i < state.size(); ++i) {
      ASSERT_EQ(loaded[i].first, state[i].first);
      const Tensor written = state[i].second.to(DType::bf16);
      EXPECT_EQ(test::to_doubles(loaded[i].second), test::to_doubles(written)) << state[i].first;
    }
  }
  hf.pop_back();

  // An unexpected tensor (weights that config.json does not describe).
  hf.emplace_back("model.layers.0.self_attn.q_proj.weight", test::random_tensor({16, 16}, DType::f32, 1, "q"));
  checkpoint::save_hf_folder(dir, hf_config_from_args(a), hf);
  expect_contains(error_of([&] { load_hf_model(dir); }), "unexpected tensor 'model.layers.0.self_attn.q_proj.weight'");

  // A missing tensor.
  hf.pop_back();
  hf.erase(hf.begin() + 3);
  checkpoint::save_hf_folder(dir, hf_config_from_args(a), hf);
  expect_contains(error_of([&] { load_hf_model(dir); }), "is not in the Hugging Face folder");

  // A dtype we do not read: the safetensors reader names the file and the tensor.
  const TempDir odd("dtype");
  write_json(odd / "config.json", hf_config_from_args(a));
  write_raw_safetensors(odd / "model.safetensors", "model.norm.weight", "F64", 128);
  e = error_of([&] { checkpoint::HfFolder::open(odd); });
  expect_contains(e, "model.norm.weight");
  expect_contains(e, "model.safetensors");
  // An integer tensor where a weight belongs.
  checkpoint::save_safetensors(odd / "model.safetensors", {{"model.norm.weight", Tensor::zeros({16}, DType::i32)}});
  expect_contains(error_of([&] { checkpoint::HfFolder::open(odd).load_f32("model.norm.weight"); }), "not a weight type");
  // No weights at all.
  fs::remove(odd / "model.safetensors");
  expect_contains(error_of([&] { checkpoint::HfFolder::open(odd); }), "no model.safetensors");
  // An index whose weight_map names a path out of the folder, not a file beside it.
  for (const char* outside : {"../model.safetensors", "/etc/passwd", "sub/model.safetensors", ".."}) {
    write_json(odd / "model.safetensors.index.json", json{{"weight_map", {{"model.norm.weight", outside}}}});
    expect_contains(error_of([&] { checkpoint::HfFolder::open(odd); }), "which is not a file in the folder");
  }
}

TEST(CkptCli, ConvertsTheFixtureToOurCheckpointAndBack) {
  const TempDir ours("cli_ours"), back("cli_back");
  std::string a0 = "ckpt", a1 = "convert", a2 = "--from-hf", a3 = "tests/fixtures/deepseek_v3_tiny", a4 = "--to",
              a5 = ours.string();
  char* argv1[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data()};
  ASSERT_EQ(cli::ckpt_main(6, argv1), 0);
  ASSERT_TRUE(fs::exists(ours / "step-0" / "metadata.json"));
  std::string b2 = "--from", b3 = (ours / "step-0").string(), b4 = "--to-hf", b5 = back.string(), b6 = "--dtype",
              b7 = "f32", b8 = "--max-shard-bytes", b9 = "100000";
  char* argv2[] = {a0.data(), a1.data(), b2.data(), b3.data(), b4.data(), b5.data(), b6.data(), b7.data(), b8.data(), b9.data()};
  ASSERT_EQ(cli::ckpt_main(10, argv2), 0);
  const checkpoint::HfFolder original = checkpoint::HfFolder::open("tests/fixtures/deepseek_v3_tiny");
  const checkpoint::HfFolder exported = checkpoint::HfFolder::open(back);
  EXPECT_TRUE(fs::exists(back / "model.safetensors.index.json"));
  ASSERT_EQ(original.names().size(), exported.names().size());
  for (const std::string& n : original.names())
    EXPECT_EQ(test::to_doubles(exported.load_f32(n)), test::to_doubles(original.load_f32(n))) << n;
  const DeepSeekV3Args x = args_from_hf_config(original.config(), "o"), y = args_from_hf_config(exported.config(), "e");
  EXPECT_EQ(x.parameters().total, y.parameters().total);
  EXPECT_DOUBLE_EQ(x.softmax_scale(), y.softmax_scale());
  EXPECT_EQ(x.norm_eps, y.norm_eps);

  std::string bad = "--frobnicate";
  char* argv3[] = {a0.data(), a1.data(), bad.data()};
  EXPECT_EQ(cli::ckpt_main(3, argv3), 2);
  std::string missing = (ours / "nothing").string();
  char* argv4[] = {a0.data(), a1.data(), a2.data(), missing.data(), a4.data(), a5.data()};
  EXPECT_EQ(cli::ckpt_main(6, argv4), 1);
}

// DeepSeek-V3.2: the indexer fields round-trip through config.json (model_type deepseek_v32) and
// its five tensors per layer through the HF names, in an HF folder written and read by the adapter.
TEST(HfAdapterV32, IndexerConfigAndTensorsRoundTrip) {
  DeepSeekV3Args a = tiny_args();
  a.n_dense_layers = 1;
  a.index_n_heads = 2, a.index_head_dim = 8, a.index_topk = 4, a.index_hadamard = false;
  const json c = hf_config_from_args(a);
  EXPECT_EQ(c["model_type"], "deepseek_v32");
  EXPECT_EQ(c["architectures"][0], "DeepseekV32ForCausalLM");
  const DeepSeekV3Args back = args_from_hf_config(c, "ours");
  EXPECT_EQ(back.index_n_heads, 2);
  EXPECT_EQ(back.index_head_dim, 8);
  EXPECT_EQ(back.index_topk, 4);
  EXPECT_FALSE(back.index_hadamard);
  EXPECT_EQ(back.n_dense_layers, 1);
  // Plain V3 args still write a V3 config without indexer keys.
  const json v3 = hf_config_from_args(tiny_args());
  EXPECT_EQ(v3["model_type"], "deepseek_v3");
  EXPECT_FALSE(v3.contains("index_n_heads"));
  EXPECT_EQ(args_from_hf_config(v3, "v3").index_n_heads, 0);

  const auto shapes = state_shapes(a);
  const std::map<std::string, Shape> by_name(shapes.begin(), shapes.end());
  const std::vector<std::tuple<std::string, std::string, Shape>> indexer = {
      {"layers.1.attention.indexer.wq_b.weight", "model.layers.1.self_attn.indexer.wq_b.weight", {16, 8}},
      {"layers.1.attention.indexer.wk.weight", "model.layers.1.self_attn.indexer.wk.weight", {8, 16}},
      {"layers.1.attention.indexer.k_norm.weight", "model.layers.1.self_attn.indexer.k_norm.weight", {8}},
      {"layers.1.attention.indexer.k_norm.bias", "model.layers.1.self_attn.indexer.k_norm.bias", {8}},
      {"layers.1.attention.indexer.weights_proj.weight", "model.layers.1.self_attn.indexer.weights_proj.weight", {2, 16}}};
  for (const auto& [ours, hf, shape] : indexer) {
    ASSERT_TRUE(by_name.count(ours)) << ours;
    EXPECT_EQ(by_name.at(ours), shape) << ours;
    EXPECT_EQ(hf_names(ours, a), std::vector<std::string>{hf}) << ours;
  }
  EXPECT_EQ(shapes.size(), state_shapes(tiny_args()).size() + 2 * 5 + (8 - 3));  // + indexers; layer 1 MoE
  const auto state = random_state(a, 6);
  const TempDir dir("v32");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  save_hf(dir, a, state, opt);
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open(dir);
  EXPECT_EQ(args_from_hf_config(folder.config(), "saved").index_n_heads, 2);
  const std::map<std::string, Tensor> loaded = load_hf_state(folder, a, shapes);  // strict: every tensor used
  for (const auto& [name, t] : state) EXPECT_EQ(test::to_doubles(loaded.at(name)), test::to_doubles(t)) << name;
  // A V3 reading of the same folder leaves the indexer tensors over, and says which.
  DeepSeekV3Args no_indexer = a;
  no_indexer.index_n_heads = 0;
  expect_contains(error_of([&] { load_hf_state(folder, no_indexer, state_shapes(no_indexer)); }),
                  "unexpected tensor 'model.layers.0.self_attn.indexer.");
}

// The V3.2 model registers exactly state_shapes() in its order (what the checkpoint converter and
// the export rely on), and loads an exported folder bit-exactly.
TEST(HfAdapterV32, ModelLoadsTheExportInStateShapesOrder) {
  DeepSeekV3Args a = tiny_args();  // all dense: no MoE layer needed
  a.index_n_heads = 2, a.index_head_dim = 8, a.index_topk = 4;
  const auto state = random_state(a, 9);
  const TempDir dir("v32_model");
  checkpoint::HfWriteOptions opt;
  opt.dtype = DType::f32;
  save_hf(dir, a, state, opt);
  std::unique_ptr<Transformer> model = load_hf_model(dir);
  ASSERT_TRUE(model->args().has_indexer());
  const auto loaded = model->state_dict();
  ASSERT_EQ(loaded.size(), state.size());
  for (size_t i = 0; i < state.size(); ++i) {
    ASSERT_EQ(loaded[i].first, state[i].first);
    EXPECT_EQ(test::to_doubles(loaded[i].second), test::to_doubles(state[i].second)) << state[i].first;
  }
}

// The fixture's config.json and weights as transformers 5 writes them (save_pretrained of a
// DeepseekV32ForCausalLM: mlp_layer_types, layer_types, rope_parameters, no scoring_func) read
// into the V3.2 architecture, and every tensor of the folder has a place in our state.
TEST(HfAdapterV32, TransformersExportReadsCompletely) {
  const checkpoint::HfFolder folder = checkpoint::HfFolder::open("tests/fixtures/deepseek_v32_tiny");
  const DeepSeekV3Args a = args_from_hf_config(folder.config(), "fixture");
  EXPECT_EQ(a.index_n_heads, 8);
  EXPECT_EQ(a.index_head_dim, 16);
  EXPECT_EQ(a.index_topk, 8);
  EXPECT_TRUE(a.index_hadamard);
  EXPECT_EQ(a.n_dense_layers, 1);
  EXPECT_EQ(a.score_func, ScoreFunc::sigmoid);  // HF's V3.2 router is always sigmoid
  EXPECT_TRUE(a.route_norm);
  EXPECT_EQ(a.route_scale, 1.5);
  EXPECT_FALSE(a.yarn());
  const std::map<std::string, Tensor> state = load_hf_state(folder, a, state_shapes(a));
  EXPECT_EQ(state.at("layers.0.attention.indexer.k_norm.bias").shape(), Shape({16}));
  EXPECT_EQ(state.at("layers.1.moe.experts.w2").shape(), Shape({4, 64, 16}));
}

TEST(HfAdapterV32, PublishedConfigGivesTheIndexerAndErrorsNameTheKey) {
  // deepseek-ai/DeepSeek-V3.2-Exp's config.json: DeepSeek-V3's keys plus the indexer's.
  json c = hf_config_from_args(deepseek_v3_flavor("671B"));
  c["model_type"] = "deepseek_v32";
  c["architectures"] = {"DeepseekV32ForCausalLM"};
  c["index_n_heads"] = 64, c["index_head_dim"] = 128, c["index_topk"] = 2048;
  c.erase("rope_interleave");
  const DeepSeekV3Args a = args_from_hf_config(c, "config.json");
  EXPECT_TRUE(a.has_indexer());
  EXPECT_EQ(a.index_n_heads, 64);
  EXPECT_EQ(a.index_topk, 2048);
  EXPECT_TRUE(a.index_hadamard);
  EXPECT_EQ(a.q_lora_rank, 1536);
  EXPECT_EQ(a.n_dense_layers, 3);

  json bad = c;
  bad["q_lora_rank"] = nullptr;
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "needs q_lora_rank > 0");
  bad = c;
  bad["index_head_dim"] = 32;
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "index_head_dim 32 must be >= qk_rope_head_dim");
  bad = c;
  bad["index_n_heads"] = 0;
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "'index_n_heads' is not positive");
  bad = c;
  bad["mlp_layer_types"] = json::array();
  for (int l = 0; l < 61; ++l) bad["mlp_layer_types"].push_back(l == 5 ? "dense" : l < 3 ? "dense" : "sparse");
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "'mlp_layer_types' entry 5");
  bad["mlp_layer_types"][5] = "sparse";
  EXPECT_EQ(args_from_hf_config(bad, "cfg.json").n_dense_layers, 3);
  bad["mlp_layer_types"][2] = "sparse";  // the list wins over first_k_dense_replace, as in transformers
  EXPECT_EQ(args_from_hf_config(bad, "cfg.json").n_dense_layers, 2);
  bad = c;
  bad["layer_types"] = {"full_attention"};
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "'layer_types'");
  bad = c;
  bad["model_type"] = "deepseek_v4";
  expect_contains(error_of([&] { args_from_hf_config(bad, "cfg.json"); }), "'deepseek_v32'");
}

// `titan ckpt convert` carries a DeepSeek-V3.2 folder (the transformers export of the fixture) to
// our checkpoint, named as the registry's deepseek_v32, and back to HF with every tensor intact.
TEST(CkptCli, ConvertsTheV32FixtureBothWays) {
  const TempDir ours("cli_v32_ours"), back("cli_v32_back");
  std::string a0 = "ckpt", a1 = "convert", a2 = "--from-hf", a3 = "tests/fixtures/deepseek_v32_tiny", a4 = "--to",
              a5 = ours.string();
  char* argv1[] = {a0.data(), a1.data(), a2.data(), a3.data(), a4.data(), a5.data()};
  ASSERT_EQ(cli::ckpt_main(6, argv1), 0);
  expect_contains(checkpoint::load_checkpoint(ours / "step-0").config_toml, "name = \"deepseek_v32\"");
  std::string b2 = "--from", b3 = (ours / "step-0").string(), b4 = "--to-hf", b5 = back.string(), b6 = "--dtype", b7 = "f32";
  char* argv2[] = {a0.data(), a1.data(), b2.data(), b3.data(), b4.data(), b5.data(), b6.data(), b7.data()};
  ASSERT_EQ(cli::ckpt_main(8, argv2), 0);
  const checkpoint::HfFolder original = checkpoint::HfFolder::open(a3), exported = checkpoint::HfFolder::open(back);
  ASSERT_EQ(original.names().size(), exported.names().size());
  for (const std::string& n : original.names())
    EXPECT_EQ(test::to_doubles(exported.load_f32(n)), test::to_doubles(original.load_f32(n))) << n;
  EXPECT_EQ(exported.config()["model_type"], "deepseek_v32");
  for (const char* key : {"index_n_heads", "index_head_dim", "index_topk"})
    EXPECT_EQ(exported.config()[key], original.config()[key]) << key;
}

// A deepseek_v32 training checkpoint (no HF config inside) exports with the V3.2 flavors: without
// a flavor the error lists them, and with one the V3.2 architecture (query latent, indexer) is
// what the tensors are checked against.
TEST(CkptCli, ExportsDeepSeekV32CheckpointsByFlavor) {
  const TempDir root("cli_v32_flavor"), out("cli_v32_flavor_hf");
  checkpoint::SaveRequest req;
  req.tensors.push_back({"model.tok_embeddings.weight", test::random_tensor({32, 256}, DType::f32, 1, "emb"), {}});
  req.config_toml = "[model]\nname = \"deepseek_v32\"\n";
  const fs::path step = checkpoint::save_checkpoint(root, req);
  auto run = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"ckpt", "convert", "--from", step.string(), "--to-hf", out.string()});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    testing::internal::CaptureStderr();
    EXPECT_EQ(cli::ckpt_main(int(argv.size()), argv.data()), 1);
    return testing::internal::GetCapturedStderr();
  };
  expect_contains(run({}), "deepseek_v32: debugmodel, 671B");
  expect_contains(run({"--flavor", "debugmodel"}), "model tensor 'layers.0.attention.wq_a.weight' is missing");
}

namespace {

const char* kSaved = "tests/fixtures/deepseek_v3_tiny_saved";         // as transformers' save_pretrained writes it
const char* kSavedMtp = "tests/fixtures/deepseek_v3_tiny_saved_mtp";  // plus DeepSeek's MTP layer (model.layers.2)

// `titan ckpt convert ARGS...`: its exit code and what it printed to stdout.
std::pair<int, std::string> convert(std::vector<std::string> args) {
  args.insert(args.begin(), {"ckpt", "convert"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  const int rc = cli::ckpt_main(int(argv.size()), argv.data());
  std::fflush(stdout);
  return {rc, testing::internal::GetCapturedStdout()};
}

std::string no_mtp_note(const std::string& dir) {
  return dir + ": config.json has num_nextn_predict_layers 1 but the folder holds no MTP weights (model.layers.2.*; "
               "transformers saves none): imported without MTP; training with --model.mtp_layers=1 starts MTP fresh, "
               "without it MTP is off";
}

// Every tensor of `b` is in `a` with the same values, and the other way round.
void expect_same_tensors(const checkpoint::HfFolder& a, const checkpoint::HfFolder& b) {
  EXPECT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    if (!b.contains(n)) continue;
    EXPECT_EQ(test::to_doubles(b.load_f32(n)), test::to_doubles(a.load_f32(n))) << n;
  }
}

}  // namespace

// config.json's num_nextn_predict_layers counts the MTP layers of DeepSeek's checkpoints, but
// transformers keeps its default 1 and saves no MTP weights: the folder's args then have none,
// with one line saying so; a folder with fewer MTP layers than declared keeps the leading ones,
// and a gap before a present layer is an error.
TEST(HfAdapter, MtpLayersAreThoseTheFolderHoldsWeightsFor) {
  std::string note = "unchanged";
  const checkpoint::HfFolder saved = checkpoint::HfFolder::open(kSaved);
  EXPECT_EQ(saved.config().at("num_nextn_predict_layers"), 1);
  DeepSeekV3Args a = args_from_hf_folder(saved, &note);
  EXPECT_EQ(a.num_mtp_layers, 0);
  EXPECT_EQ(a.n_dense_layers, 1);
  EXPECT_EQ(note, no_mtp_note(kSaved));
  EXPECT_EQ(args_from_hf_config(saved.config(), "c").num_mtp_layers, 1);  // the config alone says 1

  note = "unchanged";
  const checkpoint::HfFolder hub = checkpoint::HfFolder::open(kSavedMtp);
  EXPECT_EQ(args_from_hf_folder(hub, &note).num_mtp_layers, 1);
  EXPECT_EQ(note, "unchanged");  // no note when the folder has what config.json says

  // num_nextn_predict_layers 2 with one MTP layer; then that layer renamed to the second (a gap).
  const TempDir two("mtp_two");
  std::vector<std::pair<std::string, Tensor>> tensors, shifted;
  for (const std::string& n : hub.names()) {
    tensors.emplace_back(n, hub.load_f32(n));
    const std::string p = "model.layers.2.";
    shifted.emplace_back(n.rfind(p, 0) == 0 ? "model.layers.3." + n.substr(p.size()) : n, tensors.back().second);
  }
  json config = hub.config();
  config["num_nextn_predict_layers"] = 2;
  checkpoint::HfWriteOptions f32;
  f32.dtype = DType::f32;
  checkpoint::save_hf_folder(two, config, tensors, f32);
  a = args_from_hf_folder(checkpoint::HfFolder::open(two), &note);
  EXPECT_EQ(a.num_mtp_layers, 1);
  EXPECT_EQ(note, two.string() +
                      ": config.json has num_nextn_predict_layers 2 but the folder holds weights for the first 1 MTP "
                      "layers only (none for model.layers.3.*): imported those; training with --model.mtp_layers=2 "
                      "starts the others fresh");
  const TempDir gap("mtp_gap");
  checkpoint::save_hf_folder(gap, config, shifted, f32);
  expect_contains(error_of([&] { args_from_hf_folder(checkpoint::HfFolder::open(gap)); }),
                  "holds weights for MTP layer model.layers.3.* but none for model.layers.2.* before it");
}

// `titan ckpt convert --from-hf` on what transformers saves: the main model imports, the one-line
// note says MTP is not in the folder, and --to-hf gives back exactly the folder's tensors with
// num_nextn_predict_layers 0 (so that converting that again needs no note).
TEST(CkptCli, ConvertsAFolderTransformersSavedWithoutMtpWeights) {
  const TempDir ours("saved_ours"), back("saved_back"), again("saved_again");
  auto [rc, out] = convert({"--from-hf", kSaved, "--to", ours.string()});
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, no_mtp_note(kSaved) + "\nwrote " + (ours / "step-0").string() + " (32 tensors, MTP layers: 0)\n");
  const checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(ours / "step-0");
  const checkpoint::HfFolder original = checkpoint::HfFolder::open(kSaved);
  for (const auto& [name, t] : ck.tensors) EXPECT_FALSE(name.starts_with("model.mtp.")) << name;
  EXPECT_EQ(ck.train_state.at("hf_config"), original.config());  // the architecture travels as transformers wrote it
  EXPECT_EQ(test::to_doubles(ck.tensors.at("model.layers.1.moe.experts.w2").select(0, 3).contiguous()),
            test::to_doubles(original.load_f32("model.layers.1.mlp.experts.3.down_proj.weight")));

  std::tie(rc, out) = convert({"--from", (ours / "step-0").string(), "--to-hf", back.string(), "--dtype", "f32"});
  ASSERT_EQ(rc, 0) << out;
  const checkpoint::HfFolder exported = checkpoint::HfFolder::open(back);
  expect_same_tensors(original, exported);
  EXPECT_EQ(exported.config().at("num_nextn_predict_layers"), 0);
  std::tie(rc, out) = convert({"--from-hf", back.string(), "--to", again.string()});
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "wrote " + (again / "step-0").string() + " (32 tensors, MTP layers: 0)\n");
}

// A folder with DeepSeek's MTP layer: it imports as mtp.0 (its shared embedding and head copies
// skipped), no note, and --to-hf writes every tensor of the original back, the copies included.
TEST(CkptCli, ConvertsAFolderWithItsMtpLayer) {
  const TempDir ours("hub_ours"), back("hub_back");
  auto [rc, out] = convert({"--from-hf", kSavedMtp, "--to", ours.string()});
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "wrote " + (ours / "step-0").string() + " (53 tensors, MTP layers: 1)\n");
  const checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(ours / "step-0");
  const checkpoint::HfFolder original = checkpoint::HfFolder::open(kSavedMtp);
  for (const auto& [ours_name, hf] : std::vector<std::pair<std::string, std::string>>{
           {"mtp.0.enorm.weight", "model.layers.2.enorm.weight"},
           {"mtp.0.hnorm.weight", "model.layers.2.hnorm.weight"},
           {"mtp.0.eh_proj.weight", "model.layers.2.eh_proj.weight"},
           {"mtp.0.norm.weight", "model.layers.2.shared_head.norm.weight"},
           {"mtp.0.block.attention.wq_b.weight", "model.layers.2.self_attn.q_b_proj.weight"},
           {"mtp.0.block.moe.expert_bias", "model.layers.2.mlp.gate.e_score_correction_bias"}})
    EXPECT_EQ(test::to_doubles(ck.tensors.at("model." + ours_name)), test::to_doubles(original.load_f32(hf))) << hf;
  EXPECT_EQ(test::to_doubles(ck.tensors.at("model.mtp.0.block.moe.experts.w1").select(0, 2).contiguous()),
            test::to_doubles(original.load_f32("model.layers.2.mlp.experts.2.gate_proj.weight")));

  std::tie(rc, out) = convert({"--from", (ours / "step-0").string(), "--to-hf", back.string(), "--dtype", "f32"});
  ASSERT_EQ(rc, 0) << out;
  const checkpoint::HfFolder exported = checkpoint::HfFolder::open(back);
  expect_same_tensors(original, exported);
  EXPECT_EQ(exported.config().at("num_nextn_predict_layers"), 1);
}
