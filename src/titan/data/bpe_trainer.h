// The byte-level BPE trainer: count words, then repeatedly merge the most frequent adjacent
// pair. Follows Hugging Face's BpeTrainer step for step (id order, tie-breaking, stale-count
// handling), so the same words give the same vocabulary and merges.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace titan::data {

// Word (raw bytes, as the pre-tokenizer cut it) -> how often it occurs in the training text.
using WordCounts = std::unordered_map<std::string, int64_t>;

struct BpeVocabulary {
  // id -> token in byte-level characters: the special tokens first, then the 256 byte
  // characters ordered by code point, then one token per merge.
  std::vector<std::string> tokens;
  // The merges in rank order, as pairs of token ids.
  std::vector<std::pair<int32_t, int32_t>> merges;
};

// Learns merges until the vocabulary (special tokens included) holds `vocab_size` tokens, or no
// pair occurs at least max(1, min_frequency) times.
BpeVocabulary train_bpe(const WordCounts& words, const std::vector<std::string>& special_tokens, int vocab_size,
                        int64_t min_frequency);

}  // namespace titan::data
