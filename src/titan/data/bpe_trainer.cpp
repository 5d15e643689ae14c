#include "titan/data/bpe_trainer.h"

#include <algorithm>
#include <array>

#include "titan/data/byte_level.h"

namespace titan::data {
namespace {

// A pair of token ids packed so that integer order is (left, right) lexicographic order,
// the order Hugging Face breaks count ties with.
using Pair = uint64_t;
Pair make_pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
int32_t left_of(Pair p) { return static_cast<int32_t>(p >> 32); }
int32_t right_of(Pair p) { return static_cast<int32_t>(p & 0xFFFFFFFFu); }

// A queued merge candidate: the pair, its count when queued, and the words it occurs in.
struct Candidate {
  int64_t count;
  Pair pair;
  std::vector<size_t> words;
};
// Heap order: highest count first, then the smallest pair.
bool lower_priority(const Candidate& a, const Candidate& b) {
  if (a.count != b.count) return a.count < b.count;
  return a.pair > b.pair;
}

struct PairChange {
  Pair pair;
  int delta;
};

// Merges every non-overlapping (left, right) in `word`, scanning left to right, and reports the
// pairs that disappeared (-1) and appeared (+1) around each merge.
void merge_word(std::vector<int32_t>& word, int32_t left, int32_t right, int32_t merged,
                std::vector<PairChange>& changes) {
  size_t i = 0;
  while (i < word.size()) {
    if (word[i] == left && i + 1 < word.size() && word[i + 1] == right) {
      if (i > 0) {
        changes.push_back({make_pair_key(word[i - 1], left), -1});
        changes.push_back({make_pair_key(word[i - 1], merged), 1});
      }
      word[i] = merged;
      word.erase(word.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      if (i + 1 < word.size()) {
        changes.push_back({make_pair_key(right, word[i + 1]), -1});
        changes.push_back({make_pair_key(merged, word[i + 1]), 1});
      }
    }
    ++i;
  }
}

}  // namespace

BpeVocabulary train_bpe(const WordCounts& word_counts, const std::vector<std::string>& special_tokens, int vocab_size,
                        int64_t min_frequency) {
  BpeVocabulary out;
  std::unordered_map<std::string, int32_t> id_of;
  auto add_token = [&](const std::string& token) {
    auto [it, inserted] = id_of.emplace(token, static_cast<int32_t>(out.tokens.size()));
    if (inserted) out.tokens.push_back(token);
    return it->second;
  };
  for (const std::string& token : special_tokens) add_token(token);

  // The alphabet is all 256 byte characters, in code point order, so any text can be encoded.
  std::array<int, 256> bytes_by_code_point;
  for (int b = 0; b < 256; ++b) bytes_by_code_point[b] = b;
  auto code_point = [](int b) {
    const std::string& chars = byte_to_chars(static_cast<uint8_t>(b));
    size_t pos = 0;
    return next_code_point(chars, pos);
  };
  std::sort(bytes_by_code_point.begin(), bytes_by_code_point.end(),
            [&](int a, int b) { return code_point(a) < code_point(b); });
  std::array<int32_t, 256> byte_id;
  for (int b : bytes_by_code_point) byte_id[b] = add_token(byte_to_chars(static_cast<uint8_t>(b)));

  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> counts;
  words.reserve(word_counts.size());
  counts.reserve(word_counts.size());
  for (const auto& [word, count] : word_counts) {
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    for (char c : word) symbols.push_back(byte_id[static_cast<uint8_t>(c)]);
    words.push_back(std::move(symbols));
    counts.push_back(count);
  }

  std::unordered_map<Pair, int64_t> pair_counts;
  std::unordered_map<Pair, std::vector<size_t>> where_to_update;
  for (size_t w = 0; w < words.size(); ++w) {
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      const Pair p = make_pair_key(words[w][i], words[w][i + 1]);
      pair_counts[p] += counts[w];
      std::vector<size_t>& where = where_to_update[p];
      if (where.empty() || where.back() != w) where.push_back(w);
    }
  }

  std::vector<Candidate> queue;
  auto flush_updates = [&] {
    for (auto& [pair, where] : where_to_update) {
      const int64_t count = pair_counts[pair];
      if (count <= 0) continue;
      std::sort(where.begin(), where.end());
      where.erase(std::unique(where.begin(), where.end()), where.end());
      queue.push_back({count, pair, std::move(where)});
      std::push_heap(queue.begin(), queue.end(), lower_priority);
    }
    where_to_update.clear();
  };
  flush_updates();

  std::vector<PairChange> changes;
  while (static_cast<int>(out.tokens.size()) < vocab_size && !queue.empty()) {
    std::pop_heap(queue.begin(), queue.end(), lower_priority);
    Candidate top = std::move(queue.back());
    queue.pop_back();
    // Counts change as other merges land; a stale candidate goes back with its current count.
    const int64_t current = pair_counts[top.pair];
    if (top.count != current) {
      top.count = current;
      queue.push_back(std::move(top));
      std::push_heap(queue.begin(), queue.end(), lower_priority);
      continue;
    }
    if (top.count < 1 || min_frequency > top.count) break;

    const int32_t left = left_of(top.pair);
    const int32_t right = right_of(top.pair);
    const int32_t merged = add_token(out.tokens[left] + out.tokens[right]);
    out.merges.emplace_back(left, right);

    for (size_t w : top.words) {
      changes.clear();
      merge_word(words[w], left, right, merged, changes);
      for (const PairChange& change : changes) {
        pair_counts[change.pair] += change.delta * counts[w];
        if (change.delta > 0) where_to_update[change.pair].push_back(w);
      }
    }
    flush_updates();
  }
  return out;
}

}  // namespace titan::data
