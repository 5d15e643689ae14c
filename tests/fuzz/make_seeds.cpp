// Writes the seed corpora (tests/fuzz/corpus/<target>/) with the project's own writers, so the seeds
// are what titan really reads: run it again when a format changes.
//   build-fuzz/tests/fuzz/fuzz_make_seeds <repository root>
#include <cstdio>
#include <cstring>

#include "fixtures.h"
#include "fuzz_support.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/data/tokenizer.h"
#include "titan/train/config.h"

namespace fs = std::filesystem;
using namespace titan;
using namespace std::string_literals;

namespace {

void copy_into(const fs::path& corpus, const std::string& name, const fs::path& from) {
  fs::copy_file(from, corpus / name, fs::copy_options::overwrite_existing);
}

void config_seeds(const fs::path& root, const fs::path& out) {
  fuzz::write_file(out / "minimal.toml", "[training]\nsteps = 10\n");
  fuzz::write_file(out / "resolved_defaults.toml", train::to_toml(train::JobConfig{}));
  // fuzz_config's input: the TOML, then one override after each NUL byte.
  fuzz::write_file(out / "with_overrides.toml",
                   "[model]\nname = \"deepseek_v3\"\n[lr_scheduler]\ndecay_ratio = 0.5\n\0--training.steps=3\0"
                   "--model.converters\0a,b\0--checkpoint.enable"s);
  copy_into(out, "llama3_debug.toml", root / "configs/llama3_debug.toml");
  copy_into(out, "deepseek_v32_debug.toml", root / "configs/deepseek_v32_debug.toml");
}

void tokenizer_seeds(const fs::path& out) {
  const std::vector<std::string> texts = {"Hello world, hello there 12345.", "The quick brown fox; the lazy dog!",
                                          "héllo wörld 日本語 テキスト", "tabs\tand\nnewlines  and   spaces"};
  const std::pair<const char*, data::PreTokenizerStyle> styles[] = {{"gpt2", data::PreTokenizerStyle::gpt2},
                                                                    {"llama3", data::PreTokenizerStyle::llama3},
                                                                    {"deepseek_v3", data::PreTokenizerStyle::deepseek_v3}};
  for (const auto& [name, style] : styles) {
    const auto tok = data::Tokenizer::train(texts, {.vocab_size = 280, .special_tokens = {"<|bos|>", "<|eos|>"},
                                                    .pre_tokenizer = style});
    tok.save((out / (std::string(name) + ".json")).string());
  }
}

void safetensors_seeds(const fs::path& out) {
  Tensor a = Tensor::full({2, 3}, 1.5, DType::f32), b = Tensor::full({4}, -2.0, DType::bf16);
  Tensor c = Tensor::full({3}, 7, DType::i64), e = Tensor::zeros({0, 4}, DType::f32);
  checkpoint::save_safetensors(out / "mixed.safetensors", {{"a", a}, {"b", b}, {"c", c}, {"empty", e}},
                               {{"format", "pt"}});
  checkpoint::save_safetensors(out / "transposed.safetensors", {{"t", a.transpose(0, 1)}, {"u8", Tensor::full({5}, 3, DType::u8)}});
  checkpoint::save_safetensors(out / "scalar.safetensors", {{"s", Tensor::full({}, 2.0, DType::f16)}});
  // fuzz_safetensors's other form: the JSON header, a NUL byte, the data section.
  for (const char* name : {"mixed", "transposed"}) {
    const std::string file = fuzz::read_file(out / (std::string(name) + ".safetensors"));
    uint64_t length = 0;
    std::memcpy(&length, file.data(), 8);
    fuzz::write_file(out / (std::string(name) + ".header_nul_data"),
                     file.substr(8, length) + '\0' + file.substr(8 + length));
  }
}

void shard_seeds(const fs::path& out) {
  const fs::path tmp = fuzz::scratch_folder() / "shards";
  fuzz::write_fixture_shards(tmp);
  copy_into(out, "u16_bos.bin", tmp / "shard-0.bin");
  {
    data::ShardWriter wide((tmp / "u32.bin").string(), 70000, -1, 69999);
    wide.add_document(std::vector<int32_t>{65536, 3, 69998});
    wide.add_document(std::vector<int32_t>{});
    wide.finish();
  }
  copy_into(out, "u32_no_bos_empty_doc.bin", tmp / "u32.bin");
}

void checkpoint_seeds(const fs::path& metadata_out, const fs::path& train_state_out) {
  const fs::path root = fuzz::scratch_folder() / "ckpt";
  data::DataLoader loader(fuzz::write_fixture_shards(fuzz::scratch_folder() / "data"));
  const fs::path step = fuzz::write_fixture_checkpoint(root, fuzz::fixture_train_state(loader, 1));
  copy_into(metadata_out, "two_ranks.json", step / "metadata.json");
  fuzz::write_file(train_state_out / "start.json", fuzz::fixture_train_state(loader, 1).dump(1));
  std::vector<int32_t> in(2 * fuzz::kFixtureSeqLen), tgt(in.size());
  for (int i = 0; i < 9; ++i) loader.next_batch(in.data(), tgt.data(), 2, fuzz::kFixtureSeqLen);
  fuzz::write_file(train_state_out / "second_epoch.json", fuzz::fixture_train_state(loader, 10).dump(1));
  fuzz::write_file(train_state_out / "model_only_hf.json",
                   nlohmann::json{{"hf_config", {{"model_type", "deepseek_v3"}, {"hidden_size", 64}}}}.dump(1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <repository root>\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1], corpus = root / "tests/fuzz/corpus";
  for (const char* target : {"fuzz_config", "fuzz_tokenizer", "fuzz_safetensors", "fuzz_shard",
                             "fuzz_checkpoint_metadata", "fuzz_train_state"})
    fs::create_directories(corpus / target);
  config_seeds(root, corpus / "fuzz_config");
  tokenizer_seeds(corpus / "fuzz_tokenizer");
  safetensors_seeds(corpus / "fuzz_safetensors");
  shard_seeds(corpus / "fuzz_shard");
  checkpoint_seeds(corpus / "fuzz_checkpoint_metadata", corpus / "fuzz_train_state");
  std::printf("seeds written under %s\n", corpus.c_str());
}
