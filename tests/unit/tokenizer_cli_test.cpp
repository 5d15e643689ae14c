#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "titan/data/tokenizer.h"
#include "titan/cli/tokenizer_cli.h"

using namespace titan::data;

namespace {

int run(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return titan::cli::tokenizer_main(static_cast<int>(argv.size()), argv.data());
}

// A fresh directory per test process for files the tests write, removed at exit.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("titan_tokenizer_cli_test_" + std::to_string(::getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

std::string scratch(const std::string& name) {
  static const ScratchDir dir;
  return (dir.path / name).string();
}

}  // namespace

TEST(TokenizerCli, TrainThenEncodeAndDecode) {
  const std::string out = scratch("tokenizer.json");
  ASSERT_EQ(run({"tokenizer", "train", "--input", "tests/fixtures/tokenizer/corpus.txt", "--vocab-size", "600",
                 "--output", out, "--special", "<|start|>,<|end|>,<|pad|>", "--style", "gpt2"}),
            0);
  // BOS comes back from the post-processor the trainer wrote; EOS's custom name must be given.
  EXPECT_EQ(Tokenizer::load(out).bos_id(), 0);
  const Tokenizer tok = Tokenizer::load(out, {.eos = "<|end|>"});
  EXPECT_EQ(tok.vocab_size(), 600);
  EXPECT_EQ(tok.eos_id(), 1);
  EXPECT_EQ(tok.token_to_id("<|pad|>"), 2);
  // Paragraphs keep their newlines, so a blank line is learned as one token.
  EXPECT_EQ(tok.encode("\n\n").size(), 1u);
  EXPECT_EQ(run({"tokenizer", "encode", "--tokenizer", out, "--text", "In the beginning", "--bos"}), 0);
  EXPECT_EQ(run({"tokenizer", "encode", "--tokenizer=" + out, "--text=--looks-like-an-option"}), 0);
  EXPECT_EQ(run({"tokenizer", "decode", "--tokenizer", out, "--ids", "0,1,2"}), 0);
}

TEST(TokenizerCli, UsageAndFailures) {
  EXPECT_EQ(run({"tokenizer", "--help"}), 0);
  EXPECT_EQ(run({"tokenizer"}), 2);
  EXPECT_EQ(run({"tokenizer", "fly"}), 2);
  EXPECT_EQ(run({"tokenizer", "train", "--input", "x", "--vocab-size", "lots", "--output", "y"}), 2);
  EXPECT_EQ(run({"tokenizer", "train", "--input", "x", "--vocab-size", "300", "--output", "y", "--colour", "red"}), 2);
  EXPECT_EQ(run({"tokenizer", "train", "--input", "/nonexistent.txt", "--vocab-size", "300", "--output",
                 scratch("never.json")}),
            1);
  EXPECT_EQ(run({"tokenizer", "encode", "--tokenizer", "/nonexistent.json", "--text", "hi"}), 1);
}
