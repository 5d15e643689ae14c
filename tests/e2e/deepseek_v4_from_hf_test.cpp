// A DeepSeek-V4 folder transformers' save_pretrained wrote (tests/fixtures/deepseek_v4_tiny, in
// DeepSeek's naming: attn.wq_a, ffn.experts.E.w1, hc_attn_fn, head.weight) converts with
// `titan ckpt convert --from-hf` and `titan generate --temperature 0` continues a prompt exactly
// as transformers' greedy decode did (the fixture's greedy_ids); converted back with --to-hf
// (transformers' own naming), every tensor comes back bit for bit. The same model in the release
// layout (tests/fixtures/deepseek_v4_release: no "model." prefix, FP8 E4M3 attention and shared
// experts with UE8M0 128 x 128 block scales under ".scale", FP4 routed experts packed in int8 with
// 1 x 32 scales, bf16 embeddings) converts to exactly the weights transformers dequantized from it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/relative_error.h"
#include "titan/checkpoint/hf.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/cli/ckpt_cli.h"
#include "titan/cli/generate_cli.h"
#include "titan/data/tokenizer.h"
#include "titan/models/deepseek_v4/hf_adapter.h"

using namespace titan;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFolder = "tests/fixtures/deepseek_v4_tiny";
constexpr const char* kRelease = "tests/fixtures/deepseek_v4_release";
constexpr const char* kTokenizer = "tests/fixtures/tokenizer/gpt2_bpe.json";

int run_cli(std::vector<std::string> args, int (*main_fn)(int, char**)) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return main_fn(int(argv.size()), argv.data());
}

std::map<std::string, Tensor> ours_from(const fs::path& folder) {
  const checkpoint::HfFolder hf = checkpoint::HfFolder::open(folder);
  std::map<std::string, Tensor> tensors;
  for (const std::string& name : hf.names())
    if (!hf.is_scale(name)) tensors[name] = name.ends_with("tid2eid") ? hf.load_i64(name) : hf.load_f32(name);
  return models::deepseek_v4::state_from_hf(tensors, folder.string());
}

}  // namespace

TEST(DeepSeekV4FromHf, SavePretrainedFolderConvertsAndGeneratesAsTransformers) {
  const fs::path root = fs::temp_directory_path() / ("titan_v4_hf_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", kFolder, "--to", (root / "ckpt").string()}, cli::ckpt_main), 0);

  const auto golden = checkpoint::SafetensorsFile::open(std::string(kFolder) + "/golden.safetensors");
  const Tensor greedy = golden.get("greedy_ids");
  const std::vector<int32_t> ids(greedy.data<int32_t>(), greedy.data<int32_t>() + greedy.numel());
  const data::Tokenizer tok = data::Tokenizer::load(kTokenizer);
  const std::string prompt = "the cat sat on the";
  const size_t prompt_len = tok.encode(prompt, tok.bos_id().has_value()).size();
  ASSERT_LT(prompt_len, ids.size());
  const std::string want = tok.decode(ids, /*skip_special=*/true);  // the BOS first, as titan generate

  testing::internal::CaptureStdout();
  const int rc = run_cli({"generate", "--checkpoint", (root / "ckpt").string(), "--tokenizer", kTokenizer, "--prompt",
                          prompt, "--max-new-tokens", std::to_string(ids.size() - prompt_len), "--temperature", "0"},
                         cli::generate_main);
  const std::string out = testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, want + "\n");

  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "hf").string(), "--dtype",
                     "f32"},
                    cli::ckpt_main),
            0);
  const std::map<std::string, Tensor> original = ours_from(kFolder), back = ours_from(root / "hf");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(back.count(name)) << name;
    const Tensor& b = back.at(name);
    ASSERT_EQ(b.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(b.data_ptr(), t.data_ptr(), t.nbytes()), 0) << name;
  }
  fs::remove_all(root);
}

TEST(DeepSeekV4FromHf, ReleaseLayoutDequantizesAsTransformers) {
  const fs::path root = fs::temp_directory_path() / ("titan_v4_release_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", kRelease, "--to", (root / "ckpt").string()}, cli::ckpt_main), 0);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "hf").string(), "--dtype",
                     "f32"},
                    cli::ckpt_main),
            0);
  const std::map<std::string, Tensor> got = ours_from(root / "hf"), original = ours_from(kFolder);
  // transformers' values where the storage changed them (every FP8, FP4 and bf16 tensor), the
  // tiny model's elsewhere.
  std::map<std::string, Tensor> dequantized;
  const auto expected = checkpoint::SafetensorsFile::open(std::string(kRelease) + "/expected.safetensors");
  for (const auto& [name, entry] : expected.entries()) dequantized[name] = expected.get(name);
  const std::map<std::string, Tensor> changed = models::deepseek_v4::state_from_hf(dequantized, kRelease);
  EXPECT_GE(changed.size(), 40u);  // 5 layers' attention, shared and routed experts, router; embeddings
  ASSERT_EQ(got.size(), original.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(got.count(name)) << name;
    const auto c = changed.find(name);
    const Tensor& want = c == changed.end() ? t : c->second;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), want.shape()) << name;
    EXPECT_EQ(std::memcmp(g.data_ptr(), want.data_ptr(), want.nbytes()), 0) << name;
  }
  fs::remove_all(root);
}

// `--to-hf --quantize fp8-fp4` writes the release layout: the same tensors, dtypes and bytes as
// the fixture the reference script quantized from the same model (and transformers read), so
// transformers reads our export as it read that one; --quantize fp8 keeps the experts in FP8.
TEST(DeepSeekV4FromHf, QuantizedExportIsTheReleaseLayout) {
  const fs::path root = fs::temp_directory_path() / ("titan_v4_export_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", kFolder, "--to", (root / "ckpt").string()}, cli::ckpt_main), 0);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "fp4").string(),
                     "--quantize", "fp8-fp4"},
                    cli::ckpt_main),
            0);
  const auto want = checkpoint::SafetensorsFile::open(std::string(kRelease) + "/model.safetensors");
  const auto got = checkpoint::SafetensorsFile::open(root / "fp4" / "model.safetensors");
  ASSERT_EQ(got.entries().size(), want.entries().size());
  int64_t fp4 = 0;
  for (const auto& [name, w] : want.entries()) {
    ASSERT_TRUE(got.contains(name)) << name;
    const auto& g = got.entries().at(name);
    EXPECT_EQ(g.dtype, w.dtype) << name;
    EXPECT_EQ(g.shape, w.shape) << name;
    const Tensor a = got.get(name), b = want.get(name);
    ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), b.nbytes()), 0) << name;
    fp4 += name.find(".ffn.experts.") != std::string::npos && name.ends_with(".weight");
  }
  EXPECT_EQ(fp4, 5 * 4 * 3);  // every layer's routed experts' w1, w2, w3
  const nlohmann::json want_q = checkpoint::HfFolder::open(kRelease).config().at("quantization_config");
  EXPECT_EQ(checkpoint::HfFolder::open(root / "fp4").config().at("quantization_config"), want_q);

  // FP8 experts: one 128 x 128 block each, and the import reads them back within FP8's rounding.
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "fp8").string(),
                     "--quantize", "fp8"},
                    cli::ckpt_main),
            0);
  const checkpoint::HfFolder fp8 = checkpoint::HfFolder::open(root / "fp8");
  EXPECT_EQ(fp8.config().at("quantization_config").at("expert_dtype"), "fp8");
  const std::string w1 = "layers.0.ffn.experts.0.w1.weight";
  EXPECT_EQ(checkpoint::SafetensorsFile::open(root / "fp8" / fp8.file_of(w1)).entries().at(w1).dtype, DType::f8e4m3);
  const std::map<std::string, Tensor> original = ours_from(kFolder), back = ours_from(root / "fp8");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, t] : original) {
    const Tensor& b = back.at(name);
    ASSERT_EQ(b.shape(), t.shape()) << name;
    if (t.dtype() != DType::f32) continue;
    double err = 0, norm = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double d = double(b.data<float>()[i]) - double(t.data<float>()[i]);
      err += d * d, norm += double(t.data<float>()[i]) * double(t.data<float>()[i]);
    }
    EXPECT_LE(std::sqrt(err), 0.07 * std::sqrt(norm) + 1e-30) << name;  // E4M3: 3 mantissa bits
  }
  fs::remove_all(root);
}

// Multi-token prediction's tensors (tests/fixtures/deepseek_v4_tiny_mtp: the module under
// "model.mtp.0.") import with `--from-hf` and come back bit for bit with `--to-hf`; in the
// release layout (`--quantize fp8-fp4`) they take DeepSeek's names (mtp.0.attn.wq_a, hc_head_fn,
// e_proj FP8 with its scale, ...) and read back within FP8 / FP4 rounding.
TEST(DeepSeekV4FromHf, MtpModuleRoundTrips) {
  const std::string folder = "tests/fixtures/deepseek_v4_tiny_mtp";
  const fs::path root = fs::temp_directory_path() / ("titan_v4_mtp_hf_" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from-hf", folder, "--to", (root / "ckpt").string()}, cli::ckpt_main), 0);
  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "hf").string(), "--dtype",
                     "f32"},
                    cli::ckpt_main),
            0);
  const auto want = checkpoint::SafetensorsFile::open(folder + "/model.safetensors");
  const checkpoint::HfFolder got = checkpoint::HfFolder::open(root / "hf");
  ASSERT_EQ(got.names().size(), want.entries().size());
  int mtp = 0;
  for (const auto& [name, entry] : want.entries()) {
    const Tensor w = want.get(name), g = name.ends_with("tid2eid") ? got.load_i64(name) : got.load_f32(name);
    ASSERT_EQ(g.shape(), w.shape()) << name;
    EXPECT_EQ(std::memcmp(g.data_ptr(), w.data_ptr(), w.nbytes()), 0) << name;
    mtp += name.rfind("model.mtp.0.", 0) == 0;
  }
  EXPECT_EQ(mtp, 31);

  ASSERT_EQ(run_cli({"ckpt", "convert", "--from", (root / "ckpt").string(), "--to-hf", (root / "rel").string(),
                     "--quantize", "fp8-fp4"},
                    cli::ckpt_main),
            0);
  const checkpoint::HfFolder rel = checkpoint::HfFolder::open(root / "rel");
  for (const std::string name : {"mtp.0.e_proj.scale", "mtp.0.h_proj.scale", "mtp.0.attn.wq_a.scale", "mtp.0.hc_head_fn",
                                 "mtp.0.hc_attn_fn", "mtp.0.attn_norm.weight", "mtp.0.ffn.gate.bias",
                                 "mtp.0.ffn.experts.3.w2.weight", "mtp.0.ffn.shared_experts.w1.weight", "mtp.0.enorm.weight"})
    EXPECT_TRUE(std::find(rel.names().begin(), rel.names().end(), name) != rel.names().end()) << name;
  const std::map<std::string, Tensor> original = ours_from(folder), back = ours_from(root / "rel");
  ASSERT_EQ(back.size(), original.size());
  for (const auto& [name, t] : original) {
    if (name.rfind("mtp.", 0) != 0 || t.dtype() != DType::f32) continue;
    const Tensor& b = back.at(name);
    ASSERT_EQ(b.shape(), t.shape()) << name;
    EXPECT_LE(test::relative_error(b, t), 0.2) << name;  // FP4 experts: 1 mantissa bit
  }
  fs::remove_all(root);
}
