#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "titan/core/error.h"
#include "titan/cli/data_cli.h"
#include "titan/data/prepare.h"
#include "titan/data/shard.h"

using namespace titan;
using namespace titan::data;
using titan::cli::data_main;
using titan::cli::EncoderFactory;
using titan::data::testing::byte_encoder;
using titan::data::testing::ScratchDir;
using titan::data::testing::write_file;

namespace {

// Every document of every shard of a split, decoded back to text by the byte encoder's inverse.
std::vector<std::string> read_split(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> docs;
  for (const std::string& path : paths) {
    const ShardReader shard(path, /*verify=*/true);
    const auto offsets = shard.document_offsets();
    for (int64_t d = 0; d < shard.num_documents(); ++d) {
      std::vector<int32_t> ids(offsets[d + 1] - offsets[d]);
      shard.copy_tokens(int64_t(offsets[d]), int64_t(ids.size()), ids.data());
      docs.emplace_back(ids.begin(), ids.end());
    }
  }
  return docs;
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

}  // namespace

TEST(DataPrepare, TextParagraphsAndJsonlRecordsBecomeDocuments) {
  ScratchDir dir;
  write_file(dir / "a.txt", "first line\r\nsecond line\n\n  \n\nthird\n\n\n");
  write_file(dir / "b.jsonl", "{\"text\": \"json one\", \"id\": 1}\n\n{\"text\": \"json\\ntwo\"}\n{\"text\": \"\"}\n");
  PrepareOptions options;
  options.inputs = {dir / "a.txt", dir / "b.jsonl"};
  options.output_dir = dir / "out";
  options.tokenizer_path = "tok.json";
  options.val_fraction = 0;
  const PrepareSummary summary = prepare_dataset(options, byte_encoder());
  EXPECT_EQ(read_split(dir / "out/train"),
            (std::vector<std::string>{"first line\nsecond line", "third", "json one", "json\ntwo"}));
  EXPECT_EQ(summary.train.documents, 4);
  EXPECT_EQ(summary.train.tokens, 22 + 5 + 8 + 8);
  EXPECT_EQ(summary.val.documents, 0);

  const auto index = read_json(dir / "out/index.json");
  EXPECT_EQ(index["tokenizer"], "tok.json");
  EXPECT_EQ(index["vocab_size"], 258);
  EXPECT_EQ(index["eos_id"], 256);
  EXPECT_EQ(index["bos_id"], -1);
  EXPECT_EQ(index["train"]["documents"], 4);
  EXPECT_EQ(index["train"]["shards"], nlohmann::json::array({"shard_000000.bin"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.tmp"));
}

TEST(DataPrepare, ValidationTakesEvenlySpreadDocumentsAndShardsRollOver) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += fmt::format("document {:02d}\n\n", i);
  write_file(dir / "corpus.txt", text);
  PrepareOptions options;
  options.inputs = {dir.path().string()};  // a directory stands for its .txt/.jsonl files
  options.output_dir = dir / "out";
  options.val_fraction = 0.1;
  options.shard_tokens = 30;  // 11-token documents: a shard closes after its third
  const PrepareSummary summary = prepare_dataset(options, byte_encoder());
  // round((i + 1) / 10) > round(i / 10) at i = 4, 14, 24, 34.
  EXPECT_EQ(read_split(dir / "out/val"),
            (std::vector<std::string>{"document 04", "document 14", "document 24", "document 34"}));
  const auto train = read_split(dir / "out/train");
  ASSERT_EQ(train.size(), 36u);
  EXPECT_EQ(train.front(), "document 00");
  EXPECT_EQ(train.back(), "document 39");
  EXPECT_EQ(summary.train.shards.size(), 12u);
  EXPECT_EQ(summary.val.shards.size(), 2u);
  EXPECT_EQ(summary.val.tokens, 44);
}

TEST(DataPrepare, MalformedJsonlLineNamesFileAndLine) {
  ScratchDir dir;
  const std::string path = dir / "bad.jsonl";
  write_file(path, "{\"text\": \"fine\"}\n\n{\"text\": \"cut off\n{\"text\": \"never read\"}\n");
  PrepareOptions options;
  options.inputs = {path};
  options.output_dir = dir / "out";
  options.val_fraction = 0;
  try {
    prepare_dataset(options, byte_encoder());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.message().starts_with(path + ":3: not valid JSON (")) << e.message();
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  // A number beyond double is nlohmann's out_of_range, not parse_error (it escaped the loop).
  write_file(path, "{\"text\": \"fine\", \"score\": 1e400}\n");
  try {
    prepare_dataset(options, byte_encoder());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(e.message().starts_with(path + ":1: not valid JSON (")) << e.message();
  }
}

TEST(DataPrepare, JsonlFieldIsConfigurableAndMissingFieldNamesTheLine) {
  ScratchDir dir;
  const std::string path = dir / "docs.jsonl";
  write_file(path, "{\"content\": \"alpha\"}\n{\"content\": \"beta\"}\n{\"text\": \"gamma\"}\n");
  PrepareOptions options;
  options.inputs = {path};
  options.output_dir = dir / "out";
  options.val_fraction = 0;
  options.jsonl_field = "content";
  try {
    prepare_dataset(options, byte_encoder());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), path + ":3: no string field \"content\"");
  }
  write_file(path, "{\"content\": \"alpha\"}\n{\"content\": \"beta\"}\n");
  prepare_dataset(options, byte_encoder());
  EXPECT_EQ(read_split(dir / "out/train"), (std::vector<std::string>{"alpha", "beta"}));
}

TEST(DataPrepare, RerunReplacesItsOwnOutputButNoOtherDirectory) {
  ScratchDir dir;
  write_file(dir / "a.txt", "one\n\ntwo\n\nthree\n");
  PrepareOptions options;
  options.inputs = {dir / "a.txt"};
  options.output_dir = dir / "out";
  options.val_fraction = 0;
  options.shard_tokens = 1;  // one shard per document
  prepare_dataset(options, byte_encoder());
  EXPECT_EQ(read_split(dir / "out/train").size(), 3u);
  write_file(dir / "a.txt", "only\n");
  prepare_dataset(options, byte_encoder());
  EXPECT_EQ(read_split(dir / "out/train"), std::vector<std::string>{"only"});  // stale shards are gone

  std::filesystem::create_directories(dir / "precious");
  write_file(dir / "precious/notes.txt", "keep me");
  options.output_dir = dir / "precious";
  EXPECT_THROW(prepare_dataset(options, byte_encoder()), Error);
  EXPECT_TRUE(std::filesystem::exists(dir / "precious/notes.txt"));
}

TEST(DataPrepare, TooFewDocumentsForTheValidationFraction) {
  ScratchDir dir;
  write_file(dir / "a.txt", "one\n\ntwo\n");
  PrepareOptions options;
  options.inputs = {dir / "a.txt"};
  options.output_dir = dir / "out";
  options.val_fraction = 0.1;
  try {
    prepare_dataset(options, byte_encoder());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "data prepare: 2 documents x validation fraction 0.1 rounds to no validation document");
  }
}

TEST(DataCli, PrepareThenInspect) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 10; ++i) text += fmt::format("paragraph {}\n\n", i);
  write_file(dir / "a.txt", text);
  std::string seen_tokenizer;
  const EncoderFactory factory = [&](const std::string& tokenizer_path) {
    seen_tokenizer = tokenizer_path;
    return byte_encoder();
  };
  const std::string input = dir / "a.txt", output = dir / "out";
  std::vector<std::string> words = {"data", "prepare", "--input", input, "--tokenizer", "tok.json",
                                    "--output", output, "--val-fraction", "0.2"};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  ASSERT_EQ(data_main(int(argv.size()), argv.data(), factory), 0);
  EXPECT_EQ(seen_tokenizer, "tok.json");
  EXPECT_EQ(read_split(dir / "out/val").size(), 2u);

  std::vector<std::string> inspect = {"data", "inspect", output + "/train", "--verify"};
  std::vector<char*> inspect_argv;
  for (std::string& w : inspect) inspect_argv.push_back(w.data());
  EXPECT_EQ(data_main(int(inspect_argv.size()), inspect_argv.data(), factory), 0);

  std::vector<std::string> bad = {"data", "prepare", "--val-fraction", "lots"};
  std::vector<char*> bad_argv;
  for (std::string& w : bad) bad_argv.push_back(w.data());
  EXPECT_EQ(data_main(int(bad_argv.size()), bad_argv.data(), factory), 2);
}
