#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "titan/core/error.h"
#include "titan/data/loader.h"
#include "titan/data/shard.h"

using namespace titan;
using namespace titan::data;
using titan::data::testing::ScratchDir;

namespace {

constexpr int kSeq = 5;          // S
constexpr int32_t kEos = 0;      // every other id is unique, so a token says where it came from
constexpr int32_t kBos = 1;
constexpr int64_t kVocab = 70000;  // above 65536: exercises u32 shards

// Seven documents of distinct ids in two shards (the stream crosses the shard boundary), sized
// so the packed stream (tokens + one EOS each) is 61 = 12 * S + 1 tokens: 12 samples, which
// B = 2 on 1, 2 or 3 ranks divides into whole global batches.
struct Corpus {
  std::vector<std::vector<int32_t>> documents;
  std::vector<int32_t> stream;  // the packed stream the loader should present
};

Corpus write_corpus(const std::string& dir, bool with_bos = false) {
  Corpus corpus;
  int32_t next_id = 2;
  for (const int length : {9, 4, 14, 6, 11, 7, 3}) {
    std::vector<int32_t> doc(static_cast<size_t>(length));
    for (int32_t& id : doc) id = next_id++;
    if (with_bos) corpus.stream.push_back(kBos);
    corpus.stream.insert(corpus.stream.end(), doc.begin(), doc.end());
    corpus.stream.push_back(kEos);
    corpus.documents.push_back(std::move(doc));
  }
  std::filesystem::create_directories(dir);
  for (int s = 0; s < 2; ++s) {
    ShardWriter writer(fmt::format("{}/shard_{:06d}.bin", dir, s), kVocab, with_bos ? kBos : -1, kEos);
    for (int d = s == 0 ? 0 : 4; d < (s == 0 ? 4 : 7); ++d) writer.add_document(corpus.documents[size_t(d)]);
    writer.finish();
  }
  return corpus;
}

DataLoaderOptions options_for(const std::string& dir, int rank = 0, int world_size = 1) {
  DataLoaderOptions o;
  o.dir = dir;
  o.seq_len = kSeq;
  o.rank = rank;
  o.world_size = world_size;
  o.seed = 1234;
  return o;
}

// One batch of one rank: inputs and targets, each [B, S].
struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader, int batch_size) {
  Batch b{std::vector<int32_t>(size_t(batch_size * kSeq)), std::vector<int32_t>(size_t(batch_size * kSeq))};
  EXPECT_TRUE(loader.next_batch(b.inputs.data(), b.targets.data(), batch_size, kSeq));
  return b;
}

// The sample index a row came from: its first token is unique unless it is the separator.
int64_t sample_of(const Corpus& corpus, const int32_t* row) {
  for (int64_t i = 0; i + kSeq < int64_t(corpus.stream.size()); i += kSeq) {
    if (std::equal(row, row + kSeq, corpus.stream.begin() + i)) return i / kSeq;
  }
  ADD_FAILURE() << "row is not a sample of the stream";
  return -1;
}

}  // namespace

TEST(DataLoader, PacksDocumentsWithEosAndShiftsTargets) {
  ScratchDir dir;
  for (const bool with_bos : {false, true}) {
    const std::string shards = dir / (with_bos ? "bos" : "eos");
    const Corpus corpus = write_corpus(shards, with_bos);
    DataLoaderOptions o = options_for(shards);
    o.shuffle = false;
    o.repeat = false;
    o.verify = true;
    DataLoader loader(o);
    EXPECT_EQ(loader.stream_tokens(), int64_t(corpus.stream.size()));
    EXPECT_EQ(loader.num_samples(), (int64_t(corpus.stream.size()) - 1) / kSeq);
    EXPECT_EQ(loader.vocab_size(), kVocab);
    for (int64_t sample = 0; sample < loader.num_samples(); ++sample) {
      const Batch b = next(loader, 1);
      const auto at = corpus.stream.begin() + sample * kSeq;
      EXPECT_EQ(b.inputs, std::vector<int32_t>(at, at + kSeq)) << "sample " << sample;
      EXPECT_EQ(b.targets, std::vector<int32_t>(at + 1, at + kSeq + 1)) << "sample " << sample;
    }
    Batch end{std::vector<int32_t>(kSeq, -7), std::vector<int32_t>(kSeq, -7)};
    EXPECT_FALSE(loader.next_batch(end.inputs.data(), end.targets.data(), 1, kSeq));
    EXPECT_EQ(end.inputs, std::vector<int32_t>(kSeq, -7));  // a finished pass touches nothing
  }
}

TEST(DataLoader, SameSeedSameOrderOtherSeedOrEpochOtherOrder) {
  ScratchDir dir;
  const Corpus corpus = write_corpus(dir / "train");
  DataLoader a(options_for(dir / "train")), b(options_for(dir / "train"));
  DataLoaderOptions other_seed = options_for(dir / "train");
  other_seed.seed = 99;
  DataLoader c(other_seed);
  std::vector<int64_t> order_a, order_c;
  for (int step = 0; step < 12; ++step) {  // two epochs of 6 batches
    const Batch ba = next(a, 2), bb = next(b, 2), bc = next(c, 2);
    ASSERT_EQ(ba, bb) << "step " << step;
    for (int row = 0; row < 2; ++row) {
      order_a.push_back(sample_of(corpus, ba.inputs.data() + row * kSeq));
      order_c.push_back(sample_of(corpus, bc.inputs.data() + row * kSeq));
    }
  }
  EXPECT_EQ(a.epoch(), 1);
  const std::vector<int64_t> epoch0(order_a.begin(), order_a.begin() + 12), epoch1(order_a.begin() + 12, order_a.end());
  std::vector<int64_t> identity(12);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(epoch0, identity);
  EXPECT_NE(epoch0, epoch1);
  EXPECT_NE(order_a, order_c);
  std::vector<int64_t> sorted = epoch1;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, identity);  // a permutation: every sample once per epoch
}

TEST(DataLoader, EveryTokenOfAnEpochOnceAcrossRanks) {
  ScratchDir dir;
  const Corpus corpus = write_corpus(dir / "train");
  const int64_t covered = 12 * kSeq;  // 12 samples x S input tokens: the stream less its last token
  std::vector<int32_t> expected(corpus.stream.begin(), corpus.stream.begin() + covered);
  std::sort(expected.begin(), expected.end());
  for (const int world : {1, 2, 3}) {
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(options_for(dir / "train", r, world));
    std::vector<int32_t> seen;
    std::vector<int64_t> samples;
    const int steps = 12 / (2 * world);
    for (int step = 0; step < steps; ++step) {
      for (DataLoader& rank : ranks) {
        const Batch b = next(rank, 2);
        seen.insert(seen.end(), b.inputs.begin(), b.inputs.end());
        for (int row = 0; row < 2; ++row) {
          const int32_t* in = b.inputs.data() + row * kSeq;
          const int64_t sample = sample_of(corpus, in);
          samples.push_back(sample);
          // Targets are the same window one token on.
          const auto at = corpus.stream.begin() + sample * kSeq + 1;
          EXPECT_TRUE(std::equal(at, at + kSeq, b.targets.begin() + row * kSeq));
        }
      }
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen, expected) << "world size " << world;
    for (const DataLoader& rank : ranks) EXPECT_EQ(rank.epoch(), 0) << "world size " << world;
    // All ranks see the same epoch order, so one more step starts epoch 1 everywhere.
    for (DataLoader& rank : ranks) next(rank, 2);
    for (const DataLoader& rank : ranks) EXPECT_EQ(rank.epoch(), 1) << "world size " << world;
  }
}

TEST(DataLoader, TailShorterThanAGlobalBatchIsSkipped) {
  ScratchDir dir;
  write_corpus(dir / "train");
  DataLoader loader(options_for(dir / "train"));
  next(loader, 5);
  next(loader, 5);  // 10 of 12 samples; the remaining 2 cannot fill a batch of 5
  EXPECT_EQ(loader.epoch(), 0);
  next(loader, 5);
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.state().position, 5);
}

TEST(DataLoader, RestoreContinuesExactlyAcrossAnEpochBoundary) {
  ScratchDir dir;
  write_corpus(dir / "train");
  DataLoader original(options_for(dir / "train", 1, 2));
  for (int step = 0; step < 2; ++step) next(original, 2);  // mid-epoch: 8 of 12 samples

  const nlohmann::json saved = original.state();  // what a checkpoint's train_state.json holds
  EXPECT_EQ(saved["position"], 8);
  EXPECT_EQ(saved["epoch"], 0);
  EXPECT_EQ(saved["seed"], 1234);
  DataLoaderOptions fresh = options_for(dir / "train", 1, 2);
  fresh.seed = 5;  // the restored state's seed wins, or the continuation would differ
  DataLoader resumed(fresh);
  resumed.restore(saved.get<DataLoaderState>());
  // The last global batch of epoch 0, then all three of epoch 1.
  for (int step = 0; step < 4; ++step) EXPECT_EQ(next(original, 2), next(resumed, 2)) << "step " << step;
  EXPECT_EQ(resumed.epoch(), 1);
  EXPECT_EQ(nlohmann::json(resumed.state()), nlohmann::json(original.state()));
}

// A position saved by 3 data-parallel ranks of 1 sequence each resumes on 1 rank of 3 sequences
// (and back): the same global batch of 3 samples, the same samples after the switch as without
// it, none repeated or skipped (TorchTitan's loader cannot: its state is per rank, #816).
TEST(DataLoader, RestoreAtAnotherDataParallelDegree) {
  ScratchDir dir;
  const Corpus corpus = write_corpus(dir / "train");
  // The samples of the first 4 global batches without a switch: one rank taking 3 per step.
  std::vector<int64_t> straight;
  {
    DataLoader one(options_for(dir / "train"));
    for (int step = 0; step < 4; ++step) {
      const Batch b = next(one, 3);
      for (int row = 0; row < 3; ++row) straight.push_back(sample_of(corpus, b.inputs.data() + row * kSeq));
    }
  }
  // 3 ranks for 2 steps, then 1 rank from their state for 2 more.
  std::vector<int64_t> switched;
  std::vector<DataLoader> ranks;
  for (int r = 0; r < 3; ++r) ranks.emplace_back(options_for(dir / "train", r, 3));
  for (int step = 0; step < 2; ++step)
    for (DataLoader& rank : ranks) switched.push_back(sample_of(corpus, next(rank, 1).inputs.data()));
  DataLoader one(options_for(dir / "train"));
  one.restore(ranks[0].state());
  for (int step = 0; step < 2; ++step) {
    const Batch b = next(one, 3);
    for (int row = 0; row < 3; ++row) switched.push_back(sample_of(corpus, b.inputs.data() + row * kSeq));
  }
  EXPECT_EQ(switched, straight);
  // And from 1 rank back onto 3: rank r takes entry r of each global batch.
  std::vector<DataLoader> again;
  for (int r = 0; r < 3; ++r) {
    again.emplace_back(options_for(dir / "train", r, 3));
    again.back().restore(one.state());
  }
  DataLoader reference(options_for(dir / "train"));
  reference.restore(one.state());
  const Batch want = next(reference, 3);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(sample_of(corpus, next(again[size_t(r)], 1).inputs.data()), sample_of(corpus, want.inputs.data() + r * kSeq));
}

TEST(DataLoader, RestoreOntoOtherDataIsRefused) {
  ScratchDir dir;
  write_corpus(dir / "train");
  DataLoader loader(options_for(dir / "train"));
  DataLoaderState state = loader.state();
  state.num_samples = 13;
  try {
    loader.restore(state);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), fmt::format("data loader: the saved position is for 13 samples of seq_len 5, but {} "
                                       "holds 12 samples of seq_len 5",
                                       dir / "train"));
  }
}

// A damaged train_state.json whose JSON still parses (fuzz_train_state found the first: a key
// renamed by one byte): a titan::Error naming the key, never nlohmann's exception nor a fraction
// or huge number cast into an integer that cannot hold it.
TEST(DataLoader, DamagedSavedStateIsAClearError) {
  const nlohmann::json good = DataLoaderState{7, 0, 0, 7, 8};
  const auto message_of = [](const nlohmann::json& j) {
    try {
      (void)j.get<DataLoaderState>();
    } catch (const Error& e) {
      EXPECT_FALSE(e.hint().empty());
      return e.message();
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(message_of(good), "(no error)");
  nlohmann::json renamed = good;
  renamed.erase("num_samples");
  renamed["num_sa1mples"] = 7;
  EXPECT_EQ(message_of(renamed),
            "data loader state: \"num_samples\" is missing, not an integer in [-9223372036854775808, 9223372036854775807]");
  for (const auto& [key, value] : std::vector<std::pair<const char*, nlohmann::json>>{
           {"seq_len", 1e300}, {"seq_len", 4294967304}, {"epoch", 2.5}, {"position", "3"}, {"seed", -1}}) {
    nlohmann::json bad = good;
    bad[key] = value;
    EXPECT_NE(message_of(bad).find(fmt::format("\"{}\" is {}, not an integer", key, value.dump())), std::string::npos)
        << key << " = " << value.dump();
  }
  EXPECT_EQ(message_of(nlohmann::json::array()), "data loader state: [] is not an object");
}

TEST(DataLoader, ValidationPassIsSequentialAndResets) {
  ScratchDir dir;
  const Corpus corpus = write_corpus(dir / "val");
  DataLoaderOptions o = options_for(dir / "val", 1, 2);
  o.shuffle = false;
  o.repeat = false;
  DataLoader loader(o);
  std::vector<int64_t> samples;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int32_t> inputs(2 * kSeq), targets(2 * kSeq);
    while (loader.next_batch(inputs.data(), targets.data(), 2, kSeq)) {
      for (int row = 0; row < 2; ++row) samples.push_back(sample_of(corpus, inputs.data() + row * kSeq));
    }
    loader.reset();
  }
  // Rank 1 of 2 takes entries [2, 4) of every global batch of 4: samples 2 3, 6 7, 10 11.
  EXPECT_EQ(samples, (std::vector<int64_t>{2, 3, 6, 7, 10, 11, 2, 3, 6, 7, 10, 11}));
  EXPECT_GT(loader.seconds_spent(), 0);
}

TEST(DataLoader, ErrorsSayWhatToChange) {
  ScratchDir dir;
  std::filesystem::create_directories(dir / "empty");
  try {
    DataLoader loader(options_for(dir / "empty"));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), fmt::format("data loader: no token shards (*.bin) in {}", dir / "empty"));
    EXPECT_FALSE(e.hint().empty());
  }
  write_corpus(dir / "train");
  DataLoader loader(options_for(dir / "train", 0, 3));
  std::vector<int32_t> inputs(5 * kSeq), targets(5 * kSeq);
  EXPECT_THROW(loader.next_batch(inputs.data(), targets.data(), 5, kSeq), Error);  // 15 > 12 samples
  EXPECT_THROW(loader.next_batch(inputs.data(), targets.data(), 1, kSeq + 1), Error);
  // A shard of another tokenizer in the same directory.
  ShardWriter stranger(dir / "train/shard_000002.bin", 258, -1, 256);
  stranger.add_document(std::vector<int32_t>{1, 2});
  stranger.finish();
  EXPECT_THROW(DataLoader mixed(options_for(dir / "train")), Error);
}

// A token id outside the vocabulary (a damaged shard, or one written for another tokenizer) is a
// clear error naming the shard and the token's position, from the batches and from the corpus
// statistics alike; it used to index past the counts' end.
TEST(DataLoader, OutOfRangeTokenIdIsAClearError) {
  ScratchDir dir;
  const std::string shards = dir / "bad";
  write_corpus(shards);
  const std::string file = shards + "/shard_000001.bin";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const uint32_t bad = 80000;  // >= kVocab; token 3 of the shard (u32 tokens after the 128-byte header)
    f.seekp(std::streamoff(kShardHeaderBytes + 3 * sizeof(uint32_t)));
    f.write(reinterpret_cast<const char*>(&bad), sizeof bad);
  }
  const std::string expected = file + ": token 3 holds id 80000, outside the vocabulary of 70000";
  DataLoaderOptions o = options_for(shards);
  o.shuffle = false;
  DataLoader loader(o);
  try {
    (void)loader.unigram_entropy();
    ADD_FAILURE() << "the statistics read the bad id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
  std::vector<int32_t> inputs(12 * kSeq), targets(12 * kSeq);
  try {
    loader.next_batch(inputs.data(), targets.data(), 12, kSeq);  // the whole stream
    ADD_FAILURE() << "a batch carried the bad id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

// The unigram entropy of a small corpus counts every token and separator: here 7 documents of
// distinct ids, one EOS each (7 of 61 stream tokens), the rest once.
TEST(DataLoader, UnigramEntropyOfASmallCorpusIsExact) {
  ScratchDir dir;
  const Corpus corpus = write_corpus(dir / "c");
  DataLoader loader(options_for(dir / "c"));
  const double n = double(corpus.stream.size());  // 54 distinct tokens + 7 EOS
  const double eos = 7 / n;
  const double expected = -eos * std::log(eos) - (n - 7) * (1 / n) * std::log(1 / n);
  EXPECT_NEAR(loader.unigram_entropy(), expected, 1e-12);
}
