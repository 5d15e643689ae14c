// The training data loader: memory-mapped token shards packed into fixed-length samples,
// shuffled per epoch, split across data-parallel ranks, resumable to the exact sample.
//
// Packing (as TorchTitan does): the documents of all shards, in file-name order, form one
// stream in which every document is [BOS] tokens EOS (BOS only when the tokenizer has one).
// Sample i is stream[i*S, i*S + S + 1): inputs are its first S tokens, targets its last S, so
// consecutive samples share one token and every stream token is an input exactly once.
//
// Order: epoch e visits the samples in a pseudo-random permutation keyed by (seed, e), a
// 4-round Feistel network over Philox (a bijection computed per index, so it needs no memory
// and restoring a position costs nothing). With shuffle off the order is the stream's.
//
// Ranks: a global batch is B * world_size consecutive entries of the epoch's order; rank r
// takes entries [r*B, r*B + B) of it. A tail of fewer than B * world_size samples is skipped
// so every rank takes the same number of steps (the permutation changes which samples fall
// there, epoch to epoch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "titan/data/shard.h"

namespace titan::data {

struct DataLoaderOptions {
  std::string dir;          // a directory of *.bin shards, e.g. <prepared>/train
  int seq_len = 2048;       // S: tokens per sample (inputs), fixed for the loader's life
  int rank = 0;             // this process's data-parallel rank
  int world_size = 1;       // data-parallel ranks
  uint64_t seed = 0;        // shuffle seed
  bool shuffle = true;      // training: permute samples each epoch; validation: stream order
  bool repeat = true;       // training: epochs follow one another; validation: one pass
  bool verify = false;      // check every shard's checksum and token ids on open
};

// Where the loader stands; a checkpoint stores it to resume at the exact next sample.
struct DataLoaderState {
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t position = 0;     // entries of this epoch's order consumed by all ranks together
  int64_t num_samples = 0;  // identifies the dataset: restoring onto other data is refused
  int seq_len = 0;
};
void to_json(nlohmann::json& j, const DataLoaderState& state);
void from_json(const nlohmann::json& j, DataLoaderState& state);

class DataLoader {
 public:
  explicit DataLoader(DataLoaderOptions options);

  // Fills inputs and targets, each [B, S] row-major, with this rank's next B samples; never
  // allocates. seq_len must equal the loader's S (it is the caller's buffer width). Returns
  // false, touching nothing, when a one-pass loader (repeat = false) has no full global batch
  // left; a repeating loader moves to the next epoch and always returns true.
  bool next_batch(int32_t* inputs, int32_t* targets, int batch_size, int seq_len);

  DataLoaderState state() const;
  // Continues exactly where `state` was taken, including its seed. The world size may differ
  // from the one that took it: position counts samples of all ranks together.
  void restore(const DataLoaderState& state);
  void reset();  // back to the start of epoch 0, e.g. before each validation pass

  int64_t num_samples() const { return num_samples_; }      // samples per epoch
  int64_t stream_tokens() const { return stream_tokens_; }  // packed stream length
  int64_t vocab_size() const { return vocab_size_; }
  int64_t epoch() const { return epoch_; }
  // Entropy (nats per token) of the unigram distribution of the shards' tokens: the loss of a
  // model that ignores context. A language model has learned something once its loss is below.
  // Exact on up to 16M tokens; on a larger corpus, estimated from 256 chunks of 64K tokens spread
  // evenly over it (so it costs the same on any corpus).
  double unigram_entropy() const;
  // Wall time spent inside next_batch since construction, for the trainer's data-loading share.
  double seconds_spent() const { return seconds_spent_; }

 private:
  int64_t sample_at(int64_t entry) const;  // the epoch's order: entry -> sample index
  void read_stream(int64_t position, int64_t count, int32_t* out) const;
  // Throws naming the shard and the token's position unless ids (its tokens [begin, begin + count))
  // all lie in the vocabulary.
  void check_ids(const ShardReader& shard, int64_t begin, int64_t count, const int32_t* ids) const;

  DataLoaderOptions options_;
  std::vector<ShardReader> shards_;
  std::vector<int64_t> shard_starts_;  // [num_shards + 1] stream position where each shard starts
  int64_t separators_ = 1;             // tokens the packer adds per document: EOS, and BOS if any
  int32_t bos_id_ = -1, eos_id_ = -1;
  int64_t vocab_size_ = 0;
  int64_t stream_tokens_ = 0;
  int64_t num_samples_ = 0;
  uint64_t shuffle_key_ = 0;
  int feistel_half_bits_ = 1;
  int64_t epoch_ = 0, position_ = 0;
  double seconds_spent_ = 0;
};

}  // namespace titan::data
