// A DeepSeek-V4 folder transformers' save_pretrained wrote (tests/fixtures/deepseek_v4_tiny, in
// DeepSeek's naming: attn.wq_a, ffn.experts.E.w1, hc_attn_fn, head.weight) converts with
// `titan ckpt convert --from-hf` and `titan generate --temperature 0` continues a prompt exactly
// as transformers' greedy decode did (the fixture's greedy_ids); converted back with --to-hf
// (transformers' own naming), every tensor comes back bit for bit. The same model in the release
// layout (tests/fixtures/deepseek_v4_release: no "model." prefix, FP8 E4M3 attention and shared
// experts with UE8M0 128 x 128 block scales under ".scale", FP4 routed experts packed in int8 with
// 1 x 32 scales, bf16 embeddings) converts to exactly the weights transformers dequantized from it.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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
    tensors[name] = name.ends_with("tid2eid") ? hf.load_i64(name) : hf.load_f32(name);
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
