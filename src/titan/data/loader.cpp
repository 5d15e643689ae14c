#include "titan/data/loader.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/core/rng.h"

namespace titan::data {
namespace fs = std::filesystem;

void to_json(nlohmann::json& j, const DataLoaderState& state) {
  j = {{"seed", state.seed},
       {"epoch", state.epoch},
       {"position", state.position},
       {"num_samples", state.num_samples},
       {"seq_len", state.seq_len}};
}

namespace {

// One integer field of a saved state. A damaged train_state.json fails with a message naming the
// key, not with nlohmann's exception (which a resume does not expect) or with a fraction or a
// huge number cast to an integer that cannot hold it.
template <class T>
void read_integer(const nlohmann::json& j, const char* key, T& out) {
  const auto it = j.find(key);
  const bool found = it != j.end() && it->is_number_integer();
  const bool fits = found && (it->is_number_unsigned() ? std::in_range<T>(it->get<uint64_t>())
                                                       : std::in_range<T>(it->get<int64_t>()));
  TITAN_CHECK(fits,
              fmt::format("data loader state: \"{}\" is {}, not an integer in [{}, {}]", key,
                          it == j.end() ? std::string("missing") : it->dump(), std::numeric_limits<T>::min(),
                          std::numeric_limits<T>::max()),
              "the checkpoint's train_state.json is damaged; resume from an earlier checkpoint");
  out = it->is_number_unsigned() ? T(it->get<uint64_t>()) : T(it->get<int64_t>());
}

}  // namespace

void from_json(const nlohmann::json& j, DataLoaderState& state) {
  TITAN_CHECK(j.is_object(), fmt::format("data loader state: {} is not an object", j.dump().substr(0, 200)),
              "the checkpoint's train_state.json is damaged; resume from an earlier checkpoint");
  read_integer(j, "seed", state.seed);
  read_integer(j, "epoch", state.epoch);
  read_integer(j, "position", state.position);
  read_integer(j, "num_samples", state.num_samples);
  read_integer(j, "seq_len", state.seq_len);
}

DataLoader::DataLoader(DataLoaderOptions options) : options_(std::move(options)) {
  const std::string& dir = options_.dir;
  TITAN_CHECK(options_.seq_len > 0, fmt::format("data loader: seq_len {} must be positive", options_.seq_len),
              "set [training] seq_len to the model's context length");
  TITAN_CHECK(options_.world_size > 0 && options_.rank >= 0 && options_.rank < options_.world_size,
              fmt::format("data loader: rank {} is not in [0, world size {})", options_.rank, options_.world_size),
              "pass the data-parallel rank and size of this process");
  TITAN_CHECK(fs::is_directory(dir), fmt::format("data loader: {} is not a directory", dir),
              "pass a split directory made by `titan data prepare`, e.g. DATA/train");

  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".bin") paths.push_back(entry.path().string());
  }
  TITAN_CHECK(!paths.empty(), fmt::format("data loader: no token shards (*.bin) in {}", dir),
              "run `titan data prepare --input ... --output DATA` and pass DATA/train or DATA/val");
  // Name order makes the stream, and so every sample, the same on every machine.
  std::sort(paths.begin(), paths.end());

  shard_starts_.push_back(0);
  for (const std::string& path : paths) {
    ShardReader shard(path, options_.verify);
    const ShardHeader& h = shard.header();
    if (shards_.empty()) {
      vocab_size_ = int64_t(h.vocab_size);
      bos_id_ = h.bos_id;
      eos_id_ = h.eos_id;
      separators_ = bos_id_ >= 0 ? 2 : 1;
    }
    TITAN_CHECK(int64_t(h.vocab_size) == vocab_size_ && h.bos_id == bos_id_ && h.eos_id == eos_id_,
                fmt::format("data loader: shard {} (vocab {}, BOS {}, EOS {}) does not match {} (vocab {}, BOS {}, "
                            "EOS {})",
                            path, h.vocab_size, h.bos_id, h.eos_id, shards_.front().path(), vocab_size_, bos_id_,
                            eos_id_),
                "the directory mixes shards of different tokenizers; re-run `titan data prepare` into an empty "
                "directory");
    shard_starts_.push_back(shard_starts_.back() + shard.num_tokens() + shard.num_documents() * separators_);
    shards_.push_back(std::move(shard));
  }
  stream_tokens_ = shard_starts_.back();
  const int64_t seq = options_.seq_len;
  num_samples_ = stream_tokens_ > seq ? (stream_tokens_ - 1) / seq : 0;
  TITAN_CHECK(num_samples_ > 0,
              fmt::format("data loader: the shards in {} pack into {} tokens, fewer than one sample of seq_len + 1 = {}",
                          dir, stream_tokens_, seq + 1),
              "use more data or a shorter seq_len");
  // The smallest Feistel domain 2^(2h) that covers every sample; cycle walking maps the
  // permutation of that domain onto [0, num_samples) with under 4 steps on average.
  while ((uint64_t(1) << (2 * feistel_half_bits_)) < uint64_t(num_samples_)) ++feistel_half_bits_;
  reset();
}

void DataLoader::reset() {
  restore({options_.seed, 0, 0, num_samples_, options_.seq_len});
}

DataLoaderState DataLoader::state() const {
  return {options_.seed, epoch_, position_, num_samples_, options_.seq_len};
}

void DataLoader::restore(const DataLoaderState& state) {
  TITAN_CHECK(state.num_samples == num_samples_ && state.seq_len == options_.seq_len,
              fmt::format("data loader: the saved position is for {} samples of seq_len {}, but {} holds {} samples "
                          "of seq_len {}",
                          state.num_samples, state.seq_len, options_.dir, num_samples_, options_.seq_len),
              "resume with the same prepared data and seq_len, or start a fresh run");
  TITAN_CHECK(state.epoch >= 0 && state.position >= 0 && state.position <= num_samples_,
              fmt::format("data loader: saved position (epoch {}, sample {}) is out of range for {} samples",
                          state.epoch, state.position, num_samples_),
              "the checkpoint's train_state.json is damaged; resume from an earlier checkpoint");
  options_.seed = state.seed;
  shuffle_key_ = rng_key(state.seed, "data.shuffle");
  epoch_ = state.epoch;
  position_ = state.position;
}

int64_t DataLoader::sample_at(int64_t entry) const {
  if (!options_.shuffle) return entry;
  const int h = feistel_half_bits_;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  uint64_t x = uint64_t(entry);
  do {
    uint64_t left = x >> h, right = x & mask;
    // Four rounds make a Feistel network over a pseudo-random function a strong pseudo-random
    // permutation (Luby-Rackoff); Philox keyed by the seed, counting (round, half, epoch), is
    // that function.
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = philox4x32(shuffle_key_, right | round << 32, uint64_t(epoch_))[0] & mask;
      const uint64_t mixed = left ^ f;
      left = right;
      right = mixed;
    }
    x = left << h | right;
  } while (x >= uint64_t(num_samples_));
  return int64_t(x);
}

void DataLoader::read_stream(int64_t position, int64_t count, int32_t* out) const {
  // The shard holding `position`: the last one starting at or before it (empty shards share a
  // start with their successor; upper_bound steps past them).
  size_t s = size_t(std::upper_bound(shard_starts_.begin(), shard_starts_.end(), position) - shard_starts_.begin()) - 1;
  int64_t local = position - shard_starts_[s];
  // The document holding it: document d starts at stream offset offsets[d] + d * separators.
  auto offsets = shards_[s].document_offsets();
  int64_t lo = 0, hi = int64_t(offsets.size()) - 2;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (int64_t(offsets[mid]) + mid * separators_ <= local) lo = mid; else hi = mid - 1;
  }
  int64_t doc = lo;
  int64_t at = local - (int64_t(offsets[doc]) + doc * separators_);  // position inside [BOS] tokens EOS

  const int64_t head = bos_id_ >= 0 ? 1 : 0;
  while (count > 0) {
    const int64_t length = int64_t(offsets[doc + 1] - offsets[doc]);
    if (at < head) {
      *out++ = bos_id_;
      --count, ++at;
    } else if (at < head + length) {
      const int64_t n = std::min(count, head + length - at);
      shards_[s].copy_tokens(int64_t(offsets[doc]) + at - head, n, out);
      check_ids(shards_[s], int64_t(offsets[doc]) + at - head, n, out);
      out += n, count -= n, at += n;
    } else {
      *out++ = eos_id_;
      --count;
      at = 0;
      if (++doc == int64_t(offsets.size()) - 1) {
        // Samples never run past the stream's end, so a next non-empty shard exists whenever
        // tokens remain to be read.
        do ++s; while (count > 0 && shards_[s].num_documents() == 0);
        if (count > 0) offsets = shards_[s].document_offsets();
        doc = 0;
      }
    }
  }
}

bool DataLoader::next_batch(int32_t* inputs, int32_t* targets, int batch_size, int seq_len) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t seq = options_.seq_len;
  TITAN_CHECK(seq_len == seq, fmt::format("data loader: asked for rows of {} tokens, loader packs {}", seq_len, seq),
              "build the loader with the seq_len the buffers are sized for");
  TITAN_CHECK(batch_size > 0 && inputs && targets,
              fmt::format("data loader: batch size {} (inputs {}, targets {})", batch_size,
                          inputs ? "set" : "null", targets ? "set" : "null"),
              "pass a positive batch size and two [B, S] buffers");
  const int64_t global = int64_t(batch_size) * options_.world_size;
  TITAN_CHECK(global <= num_samples_,
              fmt::format("data loader: {} holds {} samples of {} tokens, fewer than one global batch of {} x {} ranks",
                          options_.dir, num_samples_, seq, batch_size, options_.world_size),
              "use more data, a smaller batch, or a shorter seq_len");
  if (position_ + global > num_samples_) {
    if (!options_.repeat) return false;
    ++epoch_;
    position_ = 0;
  }
  for (int64_t row = 0; row < batch_size; ++row) {
    const int64_t sample = sample_at(position_ + options_.rank * batch_size + row);
    int32_t* in = inputs + row * seq;   // [S]
    int32_t* tgt = targets + row * seq;  // [S]
    read_stream(sample * seq, seq, in);
    std::memcpy(tgt, in + 1, size_t(seq - 1) * sizeof(int32_t));
    read_stream(sample * seq + seq, 1, tgt + seq - 1);
  }
  position_ += global;
  seconds_spent_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return true;
}

void DataLoader::check_ids(const ShardReader& shard, int64_t begin, int64_t count, const int32_t* ids) const {
  // One comparison per token (ids widened from u32 may be negative): a bad one is found before
  // an embedding lookup or a count runs past the vocabulary.
  bool bad = false;
  for (int64_t i = 0; i < count; ++i) bad |= uint32_t(ids[i]) >= uint64_t(vocab_size_);
  if (!bad) [[likely]] return;
  for (int64_t i = 0; i < count; ++i)
    TITAN_CHECK(uint32_t(ids[i]) < uint64_t(vocab_size_),
                fmt::format("{}: token {} holds id {}, outside the vocabulary of {} its header declares", shard.path(),
                            begin + i, uint32_t(ids[i]), vocab_size_),
                "the shard is damaged or was written for another tokenizer: run `titan data prepare` again "
                "(`titan data inspect --verify DIR` checks every shard)");
}

double DataLoader::unigram_entropy() const {
  // A sample of the corpus, not all of it: this runs on rank 0 before step 1 while the other
  // ranks wait under the start-up deadline, and a corpus of hundreds of GB would outlast it.
  // Up to kSampleChunks chunks at evenly spaced points of the token stream (all of a small corpus).
  constexpr int64_t kChunk = int64_t(1) << 16, kSampleChunks = 256;
  std::vector<int64_t> counts(size_t(vocab_size_), 0);
  std::vector<int32_t> chunk(static_cast<size_t>(kChunk));
  int64_t total_tokens = 0, documents = 0;
  for (const ShardReader& shard : shards_) total_tokens += shard.num_tokens(), documents += shard.num_documents();
  // Counts up to one chunk of `shard` from `begin` (cut at its end).
  int64_t sampled = 0;
  const auto count = [&](const ShardReader& shard, int64_t begin) {
    const int64_t n = std::min(kChunk, shard.num_tokens() - begin);
    shard.copy_tokens(begin, n, chunk.data());
    check_ids(shard, begin, n, chunk.data());
    for (int64_t i = 0; i < n; ++i) ++counts[size_t(chunk[size_t(i)])];
    sampled += n;
  };
  if (total_tokens <= kChunk * kSampleChunks) {
    for (const ShardReader& shard : shards_)
      for (int64_t begin = 0; begin < shard.num_tokens(); begin += kChunk) count(shard, begin);
  } else {
    size_t s = 0;
    int64_t shard_start = 0;  // the first token of shards_[s] among all shards' tokens
    for (int64_t c = 0; c < kSampleChunks; ++c) {
      const int64_t at = total_tokens / kSampleChunks * c;
      while (at >= shard_start + shards_[s].num_tokens()) shard_start += shards_[s++].num_tokens();
      count(shards_[s], at - shard_start);
    }
  }
  if (sampled == 0) return 0;
  // The packer adds one EOS (and one BOS, when the tokenizer has it) per document: as many per
  // sampled token as the whole corpus has.
  const double per_token = double(documents) / double(total_tokens);
  double total = double(sampled) + double(sampled) * per_token * double(separators_);
  std::vector<double> weights(counts.begin(), counts.end());
  if (eos_id_ >= 0) weights[size_t(eos_id_)] += double(sampled) * per_token;
  if (bos_id_ >= 0) weights[size_t(bos_id_)] += double(sampled) * per_token;
  double h = 0;
  for (double c : weights)
    if (c > 0) h -= c / total * std::log(c / total);
  return h;
}

}  // namespace titan::data
