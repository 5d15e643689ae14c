#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/format.h>

#include "data_test_util.h"
#include "titan/core/error.h"
#include "titan/data/shard.h"

using namespace titan;
using namespace titan::data;
using titan::data::testing::ScratchDir;

namespace {

const std::string kHint = "re-run `titan data prepare` to rebuild the shard";

// Three documents, the middle one empty; ids span the vocabulary's ends.
std::vector<std::vector<int32_t>> sample_documents(int64_t vocab) {
  return {{0, 1, 2, int32_t(vocab - 1)}, {}, {int32_t(vocab / 2), 7, 7}};
}

void write_shard(const std::string& path, int64_t vocab, const std::vector<std::vector<int32_t>>& docs) {
  ShardWriter writer(path, vocab, -1, int32_t(vocab - 1));
  for (const auto& doc : docs) writer.add_document(doc);
  writer.finish();
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// Runs `open` and returns the titan::Error it throws (failing the test when none is thrown).
template <class F>
Error error_from(F&& open) {
  try {
    open();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected a titan::Error";
  return Error("", "", "", 0);
}

}  // namespace

TEST(DataShard, RoundTripU16AndU32) {
  ScratchDir dir;
  for (const int64_t vocab : {int64_t(258), int64_t(65536), int64_t(65537), int64_t(200000)}) {
    const std::string path = dir / fmt::format("v{}.bin", vocab);
    const auto docs = sample_documents(vocab);
    write_shard(path, vocab, docs);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

    const ShardReader reader(path, /*verify=*/true);
    const ShardHeader& h = reader.header();
    EXPECT_EQ(h.token_bytes, vocab <= 65536 ? 2u : 4u) << vocab;
    EXPECT_EQ(h.version, kShardVersion);
    EXPECT_EQ(h.vocab_size, uint64_t(vocab));
    EXPECT_EQ(h.bos_id, -1);
    EXPECT_EQ(h.eos_id, vocab - 1);
    ASSERT_EQ(reader.num_documents(), 3);
    ASSERT_EQ(reader.num_tokens(), 7);
    EXPECT_EQ(std::filesystem::file_size(path), shard_file_bytes(h));
    const auto offsets = reader.document_offsets();
    EXPECT_EQ(std::vector<uint64_t>(offsets.begin(), offsets.end()), (std::vector<uint64_t>{0, 4, 4, 7}));
    for (size_t d = 0; d < docs.size(); ++d) {
      std::vector<int32_t> got(offsets[d + 1] - offsets[d]);
      reader.copy_tokens(int64_t(offsets[d]), int64_t(got.size()), got.data());
      EXPECT_EQ(got, docs[d]) << "vocab " << vocab << " document " << d;
    }
  }
}

TEST(DataShard, HeaderIsTheDocumentedLayout) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  const auto bytes = read_bytes(path);
  // 128-byte header, 7 u16 tokens padded to 16 bytes, 4 u64 offsets.
  ASSERT_EQ(bytes.size(), 128u + 16 + 32);
  EXPECT_EQ(std::string(bytes.data(), 8), "TITANTOK");
  uint32_t version, token_bytes;
  uint64_t num_tokens, num_documents;
  std::memcpy(&version, &bytes[8], 4);
  std::memcpy(&token_bytes, &bytes[12], 4);
  std::memcpy(&num_tokens, &bytes[16], 8);
  std::memcpy(&num_documents, &bytes[24], 8);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(token_bytes, 2u);
  EXPECT_EQ(num_tokens, 7u);
  EXPECT_EQ(num_documents, 3u);
  uint64_t last_offset;
  std::memcpy(&last_offset, &bytes[bytes.size() - 8], 8);
  EXPECT_EQ(last_offset, 7u);
}

TEST(DataShard, TruncatedShardSaysHowManyBytesAreMissing) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  const auto bytes = read_bytes(path);
  write_bytes(path, {bytes.begin(), bytes.end() - 10});
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(),
            fmt::format("token shard {} is truncated: {} bytes, expected {} (10 bytes missing)", path,
                        bytes.size() - 10, bytes.size()));
  EXPECT_EQ(e.hint(), kHint);

  write_bytes(path, {bytes.begin(), bytes.begin() + 100});
  const Error header = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(header.message(),
            fmt::format("token shard {} is truncated: 100 bytes, 28 bytes missing from the 128-byte header", path));
}

TEST(DataShard, TrailingBytesAreRefused) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  auto bytes = read_bytes(path);
  const size_t size = bytes.size();
  bytes.resize(size + 3);
  write_bytes(path, bytes);
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(), fmt::format("token shard {} has {} bytes, expected {} (3 unexpected trailing bytes)", path,
                                     size + 3, size));
}

TEST(DataShard, CorruptPayloadFailsTheChecksum) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  auto bytes = read_bytes(path);
  bytes[128 + 2] ^= 0x01;  // the low byte of token 1
  write_bytes(path, bytes);
  ShardReader unchecked(path);  // sizes and offsets are intact, so only verify can tell
  const Error e = error_from([&] { ShardReader reader(path, /*verify=*/true); });
  EXPECT_TRUE(e.message().starts_with(fmt::format("token shard {} is corrupt: checksum ", path))) << e.message();
  EXPECT_NE(e.message().find("does not match"), std::string::npos);
  EXPECT_EQ(e.hint(), kHint);
}

TEST(DataShard, CorruptOffsetsAreRefusedOnOpen) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  auto bytes = read_bytes(path);
  // Offsets [0, 4, 4, 7] become [0, 6, 5, 7]: document 2 would start before document 1.
  const uint64_t first = 6, second = 5;
  std::memcpy(&bytes[128 + 16 + 8], &first, 8);
  std::memcpy(&bytes[128 + 16 + 16], &second, 8);
  write_bytes(path, bytes);
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(),
            fmt::format("token shard {} is corrupt: document 2 starts at token 5 after document 1 at 6", path));
}

TEST(DataShard, WrongMagicNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  auto bytes = read_bytes(path);
  std::memcpy(bytes.data(), "GPT2TOKS", 8);
  write_bytes(path, bytes);
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(), fmt::format("{} is not a titan token shard: its first 8 bytes are not \"TITANTOK\"", path));
  EXPECT_FALSE(e.hint().empty());
}

TEST(DataShard, WrongVersionNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  auto bytes = read_bytes(path);
  const uint32_t future = 7;
  std::memcpy(&bytes[8], &future, 4);
  write_bytes(path, bytes);
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(), fmt::format("token shard {} has format version 7; this build reads version 1", path));
  EXPECT_EQ(e.hint(), kHint + " with this build");
}

TEST(DataShard, MissingFileNamesTheFile) {
  ScratchDir dir;
  const std::string path = dir / "absent.bin";
  const Error e = error_from([&] { ShardReader reader(path); });
  EXPECT_EQ(e.message(), fmt::format("cannot open token shard {}: No such file or directory", path));
}

TEST(DataShard, UnfinishedWriterLeavesNoFile) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  {
    ShardWriter writer(path, 258, -1, 256);
    writer.add_document(std::vector<int32_t>{1, 2, 3});
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(DataShard, TokenOutsideTheVocabularyIsRefused) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  ShardWriter writer(path, 258, -1, 256);
  writer.add_document(std::vector<int32_t>{1});
  const Error e = error_from([&] { writer.add_document(std::vector<int32_t>{5, 300}); });
  EXPECT_EQ(e.message(), fmt::format("token shard {}: document 1 has token id 300 at position 1, outside the "
                                     "vocabulary [0, 258)",
                                     path));
}

TEST(DataShard, MoveKeepsTheMapping) {
  ScratchDir dir;
  const std::string path = dir / "s.bin";
  write_shard(path, 258, sample_documents(258));
  std::vector<ShardReader> readers;
  readers.emplace_back(path);
  readers.emplace_back(path);  // the reallocation moves the first reader
  int32_t token = -1;
  readers[0].copy_tokens(3, 1, &token);
  EXPECT_EQ(token, 257);
}
