#include "titan/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/data/bpe_trainer.h"
#include "titan/data/byte_level.h"
#include "titan/data/pre_tokenizer.h"

namespace titan::data {

// Parsed with sorted-key objects: nlohmann's insertion-ordered objects look keys up linearly,
// which is quadratic on a 128k-token vocab.
using Json = nlohmann::json;

namespace {

// Hash and equality that accept std::string_view, so lookups by a view allocate nothing.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A token with its own id that is matched in raw text before pre-tokenization
// (tokenizer.json "added_tokens"): special tokens like <|eot_id|> and user additions.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;  // only where no word character touches it on either side
  bool lstrip = false;       // also swallows the whitespace before it
  bool rstrip = false;       // also swallows the whitespace after it
  bool normalized = false;   // matched after normalization (identity here, but in a second pass)
  bool special = false;      // skipped by decode(skip_special = true)
};

// Leftmost-longest matching of a set of strings (Hugging Face uses Aho-Corasick with the same
// semantics): a byte trie walked from each start position that can begin a token.
class AddedTokenMatcher {
 public:
  void add(std::string_view content, int32_t added_index) {
    int32_t node = 0;
    for (char c : content) {
      const auto byte = static_cast<unsigned char>(c);
      int32_t child = child_of(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].children.emplace_back(byte, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].added_index = added_index;
    can_start_[static_cast<unsigned char>(content.front())] = true;
    empty_ = false;
  }

  bool empty() const { return empty_; }

  // The leftmost, then longest, token occurring in `text` at or after `pos`.
  bool find(std::string_view text, size_t pos, size_t& begin, size_t& end, int32_t& added_index) const {
    for (size_t start = pos; start < text.size(); ++start) {
      if (!can_start_[static_cast<unsigned char>(text[start])]) continue;
      int32_t node = 0;
      added_index = -1;
      for (size_t k = start; k < text.size(); ++k) {
        node = child_of(node, static_cast<unsigned char>(text[k]));
        if (node < 0) break;
        if (nodes_[node].added_index >= 0) {
          added_index = nodes_[node].added_index;
          end = k + 1;
        }
      }
      if (added_index >= 0) {
        begin = start;
        return true;
      }
    }
    return false;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t added_index = -1;
  };
  int32_t child_of(int32_t node, unsigned char byte) const {
    for (const auto& [b, child] : nodes_[node].children)
      if (b == byte) return child;
    return -1;
  }
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> can_start_{};
  bool empty_ = true;
};

// A stretch of input: raw text still to be pre-tokenized, or one matched added token.
struct Segment {
  std::string_view text;
  int32_t added_id = -1;
};

// Word characters for single_word added tokens: Unicode \w as Rust's regex crate defines it.
bool is_word_char(char32_t c) {
  static const Regex word_char(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])");
  char utf8[4];
  size_t n;
  if (c < 0x80) {
    utf8[0] = static_cast<char>(c), n = 1;
  } else if (c < 0x800) {
    utf8[0] = static_cast<char>(0xC0 | (c >> 6)), utf8[1] = static_cast<char>(0x80 | (c & 0x3F)), n = 2;
  } else if (c < 0x10000) {
    utf8[0] = static_cast<char>(0xE0 | (c >> 12)), utf8[1] = static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    utf8[2] = static_cast<char>(0x80 | (c & 0x3F)), n = 3;
  } else {
    utf8[0] = static_cast<char>(0xF0 | (c >> 18)), utf8[1] = static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    utf8[2] = static_cast<char>(0x80 | ((c >> 6) & 0x3F)), utf8[3] = static_cast<char>(0x80 | (c & 0x3F)), n = 4;
  }
  size_t begin, end;
  return word_char.find(std::string_view(utf8, n), 0, begin, end);
}

// Well-known names of document delimiters, most specific first.
constexpr const char* kKnownBos[] = {"<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<|bos|>", "<s>",
                                     "<|startoftext|>", "<|endoftext|>"};
constexpr const char* kKnownEos[] = {"<|end_of_text|>", "<｜end▁of▁sentence｜>", "<|eos|>", "</s>", "<|endoftext|>"};

// Words longer than this are rare and would bloat the cache; they are merged every time.
constexpr size_t kMaxCachedWordBytes = 64;
// Hugging Face stops caching at a fixed size too; a training corpus's distinct words beyond
// this are mostly one-offs.
constexpr size_t kWordCacheCapacity = 1 << 18;

}  // namespace

struct Tokenizer::Impl {
  std::string origin;  // the file it came from, or "trained tokenizer", for error messages

  // What save() writes.
  std::vector<std::string> tokens;   // id -> token as tokenizer.json spells it
  std::vector<uint8_t> in_model;     // id -> is in model.vocab (else only an added token)
  std::vector<std::pair<int32_t, int32_t>> merges;  // rank order, as listed
  std::vector<AddedToken> added;
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool ignore_merges = false;  // a word that is itself in the vocab is one token (Llama-3)
  PreTokenizer pre_tokenizer;
  Json version = "1.0", truncation, padding, normalizer, post_processor, decoder;

  // Derived by index().
  std::vector<std::string> token_bytes;  // id -> bytes it decodes to
  std::vector<int32_t> added_index;      // id -> index into `added`, or -1
  StringMap<int32_t> vocab;              // model.vocab
  StringMap<int32_t> added_ids;          // added token content -> id
  struct MergeRule {
    int32_t rank;
    int32_t merged_id;
  };
  std::unordered_map<uint64_t, MergeRule> merge_rules;
  std::array<int32_t, 256> byte_ids{};  // byte -> id of its single-character token, or -1
  std::optional<int32_t> unk_id, bos, eos;
  AddedTokenMatcher raw_matcher, normalized_matcher;

  // word bytes -> ids, shared by every thread encoding with this tokenizer.
  mutable std::shared_mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  void index(const SpecialTokenNames& names);
  std::optional<int32_t> lookup(std::string_view token) const;
  std::optional<int32_t> resolve_special(const std::string& name, const char* role, std::optional<int32_t> implied,
                                         std::span<const char* const> known) const;
  std::optional<int32_t> template_bos(const Json& processor) const;
  void split_added(const std::vector<Segment>& in, const AddedTokenMatcher& matcher, std::vector<Segment>& out) const;
  void encode_words(std::span<const std::string_view> words, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
};

// ---- lookups and encoding -------------------------------------------------------------------

std::optional<int32_t> Tokenizer::Impl::lookup(std::string_view token) const {
  if (auto it = added_ids.find(token); it != added_ids.end()) return it->second;
  if (auto it = vocab.find(token); it != vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::Impl::resolve_special(const std::string& name, const char* role,
                                                        std::optional<int32_t> implied,
                                                        std::span<const char* const> known) const {
  if (!name.empty()) {
    const auto id = lookup(name);
    TITAN_CHECK(id.has_value(), "the " + std::string(role) + " token '" + name + "' is not in " + origin,
                "name a token from its added_tokens or model.vocab, or leave the name empty to detect a "
                "well-known one");
    return id;
  }
  if (implied) return implied;
  for (const char* candidate : known)
    if (auto id = lookup(candidate)) return id;
  return std::nullopt;
}

// The special token a TemplateProcessing post-processor puts before every text (Llama-3 and
// tokenizers trained here write one), possibly inside a Sequence of processors.
std::optional<int32_t> Tokenizer::Impl::template_bos(const Json& processor) const {
  if (!processor.is_object()) return std::nullopt;
  const std::string type = processor.value("type", "");
  if (type == "Sequence" && processor.contains("processors") && processor["processors"].is_array()) {
    for (const Json& inner : processor["processors"])
      if (auto id = template_bos(inner)) return id;
  }
  if (type != "TemplateProcessing" || !processor.contains("single") || !processor["single"].is_array() ||
      processor["single"].empty())
    return std::nullopt;
  const Json& first = processor["single"][0];
  if (!first.is_object() || !first.contains("SpecialToken") || !first["SpecialToken"].is_object()) return std::nullopt;
  const Json& name = first["SpecialToken"].value("id", Json());
  return name.is_string() ? lookup(name.get<std::string>()) : std::nullopt;
}

void Tokenizer::Impl::index(const SpecialTokenNames& names) {
  const size_t n = tokens.size();
  token_bytes.resize(n);
  added_index.assign(n, -1);
  vocab.clear();
  added_ids.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    added_index[added[i].id] = static_cast<int32_t>(i);
    added_ids.emplace(added[i].content, added[i].id);
  }
  for (size_t id = 0; id < n; ++id) {
    if (in_model[id]) vocab.emplace(tokens[id], static_cast<int32_t>(id));
    // An added token decodes to its literal text, even when the model vocab also holds it.
    token_bytes[id] = added_index[id] >= 0 ? tokens[id] : chars_to_bytes(tokens[id]);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(byte_to_chars(static_cast<uint8_t>(b)));
    byte_ids[b] = it == vocab.end() ? -1 : it->second;
  }
  merge_rules.clear();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto [left, right] = merges[rank];
    // Hugging Face keeps the last rank of a pair listed twice.
    merge_rules.insert_or_assign(pair_key(left, right),
                                 MergeRule{static_cast<int32_t>(rank), vocab.at(tokens[left] + tokens[right])});
  }
  unk_id = unk_token ? std::optional<int32_t>(vocab.at(*unk_token)) : std::nullopt;
  raw_matcher = {};
  normalized_matcher = {};
  for (size_t i = 0; i < added.size(); ++i)
    (added[i].normalized ? normalized_matcher : raw_matcher).add(added[i].content, static_cast<int32_t>(i));
  bos = resolve_special(names.bos, "BOS", template_bos(post_processor), kKnownBos);
  eos = resolve_special(names.eos, "EOS", std::nullopt, kKnownEos);
}

void Tokenizer::Impl::split_added(const std::vector<Segment>& in, const AddedTokenMatcher& matcher,
                                  std::vector<Segment>& out) const {
  for (const Segment& segment : in) {
    if (segment.added_id >= 0 || matcher.empty()) {
      out.push_back(segment);
      continue;
    }
    // Each segment is matched on its own, so strips and word boundaries stop at its edges.
    const std::string_view text = segment.text;
    size_t done = 0;  // text before this is already emitted
    size_t search = 0;
    size_t begin = 0, end = 0;
    int32_t index = -1;
    while (matcher.find(text, search, begin, end, index)) {
      search = end;
      const AddedToken& token = added[index];
      if (begin < done) continue;  // inside the whitespace a previous rstrip swallowed
      if (token.single_word) {
        const bool word_before = begin > 0 && is_word_char(code_point_before(text, begin));
        size_t after = end;
        const bool word_after = end < text.size() && is_word_char(next_code_point(text, after));
        if (word_before || word_after) continue;
      }
      if (token.lstrip) {
        while (begin > done && is_unicode_whitespace(code_point_before(text, begin))) {
          --begin;
          while ((static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) --begin;
        }
      }
      if (token.rstrip) {
        while (end < text.size()) {
          size_t after = end;
          if (!is_unicode_whitespace(next_code_point(text, after))) break;
          end = after;
        }
      }
      if (begin > done) out.push_back({text.substr(done, begin - done)});
      out.push_back({text.substr(begin, end - begin), token.id});
      done = end;
    }
    if (done < text.size()) out.push_back({text.substr(done)});
  }
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    if (auto it = vocab.find(bytes_to_chars(word)); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Doubly linked symbols; a merged-away symbol has length 0.
  struct Symbol {
    int32_t id, prev, next, length;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto append = [&](int32_t id, int32_t length) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, length});
  };
  for (char c : word) {
    const int32_t id = byte_ids[static_cast<uint8_t>(c)];
    if (id >= 0) {
      append(id, 1);
    } else if (unk_id) {
      // A byte the vocab lacks becomes the unknown token; fuse_unk joins runs of them.
      if (fuse_unk && !symbols.empty() && symbols.back().id == *unk_id) {
        ++symbols.back().length;
      } else {
        append(*unk_id, 1);
      }
    }
    // Without an unknown token Hugging Face drops the byte; so do we.
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Lowest rank first, leftmost on ties: the order Hugging Face applies merges in.
  struct Candidate {
    int32_t rank, pos, merged_id;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate> queue;
  auto push_pair = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merge_rules.find(pair_key(symbols[pos].id, symbols[next].id));
    if (it != merge_rules.end()) queue.push({it->second.rank, pos, it->second.merged_id});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push_pair(pos);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    // Skip candidates a previous merge made stale: the symbol is gone or its pair changed.
    if (left.length == 0 || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    auto it = merge_rules.find(pair_key(left.id, right.id));
    if (it == merge_rules.end() || it->second.merged_id != top.merged_id) continue;
    symbols[left.next].length = 0;
    left.id = top.merged_id;
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols)
    if (s.length > 0) out.push_back(s.id);
}

void Tokenizer::Impl::encode_words(std::span<const std::string_view> words, std::vector<int32_t>& out) const {
  // One read lock covers a run of cache hits; a miss drops it while merging, and new entries
  // go in a batch at a time, so threads rarely wait on each other.
  constexpr size_t kBatch = 64;
  std::vector<std::pair<std::string_view, std::vector<int32_t>>> learned;
  auto publish = [&] {
    std::unique_lock write(cache_mutex);
    for (auto& [word, ids] : learned) {
      if (cache.size() >= kWordCacheCapacity) break;
      cache.try_emplace(std::string(word), std::move(ids));
    }
    learned.clear();
  };
  std::shared_lock read(cache_mutex);
  for (std::string_view word : words) {
    const bool cacheable = word.size() <= kMaxCachedWordBytes;
    if (cacheable) {
      if (auto it = cache.find(word); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    read.unlock();
    const size_t first = out.size();
    bpe(word, out);
    if (cacheable) {
      learned.emplace_back(word, std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
      if (learned.size() == kBatch) publish();
    }
    read.lock();
  }
  read.unlock();
  if (!learned.empty()) publish();
}

Tokenizer::Tokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const Impl& m = *impl_;
  const size_t bad = invalid_utf8_offset(text);
  TITAN_CHECK(bad == std::string_view::npos,
              "text to encode is not valid UTF-8 at byte " + std::to_string(bad) + " of " +
                  std::to_string(text.size()),
              "decode the source with its real encoding, or replace invalid bytes (Python: errors='replace') "
              "before tokenizing");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos) {
    TITAN_CHECK(m.bos.has_value(), "encode(add_bos = true): " + m.origin + " has no BOS token",
                "name one with SpecialTokenNames{.bos = \"...\"} when loading, or encode without add_bos");
    ids.push_back(*m.bos);
  }
  // Added tokens that skip normalization are cut out first, then the normalized ones.
  std::vector<Segment> raw_split, segments;
  m.split_added({Segment{text}}, m.raw_matcher, raw_split);
  m.split_added(raw_split, m.normalized_matcher, segments);

  std::vector<std::string_view> words;
  std::deque<std::string> arena;
  for (const Segment& segment : segments) {
    if (segment.added_id >= 0) {
      ids.push_back(segment.added_id);
      continue;
    }
    words.clear();
    m.pre_tokenizer.split(segment.text, words, arena);
    m.encode_words(words, ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  for (const int32_t id : ids) {
    TITAN_CHECK(id >= 0 && id < vocab_size(),
                "cannot decode id " + std::to_string(id) + ": " + m.origin + " has " + std::to_string(vocab_size()) +
                    " tokens (ids 0.." + std::to_string(vocab_size() - 1) + ")",
                "the ids were made with a different tokenizer or are corrupt; decode with the tokenizer that "
                "encoded them");
    if (skip_special && is_special(id)) continue;
    out += m.token_bytes[id];
  }
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->tokens.size()); }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->lookup(token); }

const std::string& Tokenizer::id_to_token(int32_t id) const {
  TITAN_CHECK(id >= 0 && id < vocab_size(),
              "id_to_token(" + std::to_string(id) + "): ids run 0.." + std::to_string(vocab_size() - 1),
              "check the id comes from this tokenizer");
  return impl_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  const int32_t index = id >= 0 && id < vocab_size() ? impl_->added_index[id] : -1;
  return index >= 0 && impl_->added[index].special;
}

// ---- tokenizer.json -------------------------------------------------------------------------

namespace {

[[noreturn]] void fail_field(const std::string& file, const std::string& field, const std::string& problem,
                             const std::string& hint) {
  TITAN_FAIL("tokenizer file '" + file + "': field '" + field + "' " + problem, hint);
}

const Json& require(const Json& object, const char* key, const std::string& file, const std::string& field,
                    const std::string& hint) {
  if (!object.contains(key)) fail_field(file, field.empty() ? key : field + "." + key, "is missing", hint);
  return object[key];
}

bool optional_bool(const Json& object, const char* key, bool fallback, const std::string& file,
                   const std::string& field) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  if (!object[key].is_boolean())
    fail_field(file, field + "." + key, "is " + object[key].dump() + ", not true/false", "write true or false");
  return object[key].get<bool>();
}

// A token id from JSON: an integer in [0, 2^31).
bool is_id(const Json& value) {
  return value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= INT32_MAX;
}

[[noreturn]] void fail_id(const Json& value, const std::string& file, const std::string& field) {
  fail_field(file, field, "is " + value.dump() + ", not a token id", "token ids are integers from 0 to vocab size - 1");
}

int32_t parse_id(const Json& value, const std::string& file, const std::string& field) {
  if (!is_id(value)) fail_id(value, file, field);
  return static_cast<int32_t>(value.get<int64_t>());
}

// The normalizers titan reproduces exactly: none at all.
void check_normalizer(const Json& normalizer, const std::string& file) {
  if (normalizer.is_null()) return;
  const bool empty_sequence = normalizer.is_object() && normalizer.value("type", "") == "Sequence" &&
                              normalizer.contains("normalizers") && normalizer["normalizers"].is_array() &&
                              normalizer["normalizers"].empty();
  if (!empty_sequence)
    fail_field(file, "normalizer", "is " + normalizer.dump().substr(0, 200) + ", which titan does not apply",
               "byte-level BPE tokenizers (GPT-2, Llama-3, DeepSeek) use no normalizer; with a normalizer "
               "(NFC, Lowercase, ...) ids would differ from Hugging Face, so titan refuses the file");
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path, const SpecialTokenNames& names) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in.good(), "cannot open tokenizer file '" + path + "'",
              "check the path; a Hugging Face model directory keeps it as tokenizer.json, and "
              "`titan tokenizer train` writes one");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {  // parse_error, or out_of_range for a number beyond double ("1e400")
    TITAN_FAIL("tokenizer file '" + path + "' is not valid JSON: " + e.what(),
               "the file is truncated or is not a tokenizer.json (a failed download often saves an HTML page); "
               "fetch it again");
  }
  if (!root.is_object())
    TITAN_FAIL("tokenizer file '" + path + "' holds " + std::string(root.type_name()) + ", not a JSON object",
               "a tokenizer.json is an object with \"model\", \"added_tokens\" and \"pre_tokenizer\" fields");

  auto impl = std::make_shared<Impl>();
  impl->origin = "tokenizer file '" + path + "'";
  const Json& model = require(root, "model", path, "", "a tokenizer.json describes its vocabulary under \"model\"");
  if (!model.is_object()) fail_field(path, "model", "is not an object", "\"model\" must be {\"type\": \"BPE\", ...}");
  // Files from old versions of `tokenizers` leave out the type of a BPE model.
  const std::string type = model.contains("type") && model["type"].is_string() ? model["type"].get<std::string>()
                                                                               : "BPE";
  if (type != "BPE")
    fail_field(path, "model.type", "is '" + type + "', not 'BPE'",
               "titan reads byte-level BPE tokenizers (GPT-2, Llama-3, DeepSeek); WordPiece, Unigram and "
               "WordLevel models cannot be loaded: train a BPE tokenizer with `titan tokenizer train`");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    fail_field(path, "model.dropout", "is " + model["dropout"].dump() + "; titan encodes deterministically",
               "BPE dropout is a training-time augmentation; set \"dropout\": null");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(affix) && !model[affix].is_null() && model[affix] != "")
      fail_field(path, std::string("model.") + affix, "is " + model[affix].dump() + ", which byte-level BPE never uses",
                 std::string("set \"") + affix + "\": null; word-piece affixes belong to other tokenizer families");
  }
  if (optional_bool(model, "byte_fallback", false, path, "model"))
    fail_field(path, "model.byte_fallback", "is true, which byte-level BPE never uses",
               "byte fallback belongs to SentencePiece-style BPE (Llama-2, Mistral); set it to false for a "
               "byte-level vocabulary");
  impl->fuse_unk = optional_bool(model, "fuse_unk", false, path, "model");
  impl->ignore_merges = optional_bool(model, "ignore_merges", false, path, "model");

  // Vocabulary: every id in 0..N-1 names exactly one token, model and added tokens together.
  const Json& vocab = require(model, "vocab", path, "model", "the BPE model lists its tokens as \"vocab\": {token: id}");
  if (!vocab.is_object())
    fail_field(path, "model.vocab", "is " + std::string(vocab.type_name()) + ", not an object",
               "write the vocabulary as {\"token\": id, ...}");
  std::unordered_map<int32_t, std::string> token_of_id;
  StringMap<int32_t> model_ids;
  int32_t max_id = -1;
  std::string max_field;
  token_of_id.reserve(vocab.size());
  model_ids.reserve(vocab.size());
  auto vocab_field = [](const std::string& token) { return "model.vocab[" + Json(token).dump() + "]"; };
  std::string max_token;
  for (const auto& [token, value] : vocab.items()) {
    // Field names are built only on failure: this loop runs once per token.
    if (!is_id(value)) fail_id(value, path, vocab_field(token));
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    auto [it, inserted] = token_of_id.emplace(id, token);
    if (!inserted)
      fail_field(path, vocab_field(token), "reuses id " + std::to_string(id) + " of token " + Json(it->second).dump(),
                 "each token needs its own id; regenerate the vocabulary");
    model_ids.emplace(token, id);
    if (id > max_id) max_id = id, max_token = token;
  }
  if (max_id >= 0) max_field = vocab_field(max_token);

  const Json added_tokens = root.contains("added_tokens") && !root["added_tokens"].is_null() ? root["added_tokens"]
                                                                                            : Json::array();
  if (!added_tokens.is_array())
    fail_field(path, "added_tokens", "is not a list", "write added tokens as [{\"id\": 0, \"content\": \"...\"}, ...]");
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const Json& entry = added_tokens[i];
    if (!entry.is_object()) fail_field(path, field, "is not an object", "write {\"id\": 0, \"content\": \"...\"}");
    AddedToken token;
    token.id = parse_id(require(entry, "id", path, field, "every added token has an \"id\""), path, field + ".id");
    const Json& content = require(entry, "content", path, field, "every added token has its text as \"content\"");
    if (!content.is_string() || content.get<std::string>().empty())
      fail_field(path, field + ".content", "is " + content.dump() + ", not a non-empty string",
                 "write the token's text, e.g. \"<|eot_id|>\"");
    token.content = content.get<std::string>();
    token.special = optional_bool(entry, "special", false, path, field);
    token.single_word = optional_bool(entry, "single_word", false, path, field);
    token.lstrip = optional_bool(entry, "lstrip", false, path, field);
    token.rstrip = optional_bool(entry, "rstrip", false, path, field);
    token.normalized = optional_bool(entry, "normalized", !token.special, path, field);
    auto [it, inserted] = token_of_id.emplace(token.id, token.content);
    if (!inserted && it->second != token.content)
      fail_field(path, field + ".id", "is " + std::to_string(token.id) + ", already the id of " + Json(it->second).dump(),
                 "give the added token an unused id, or the same text as the vocab entry with that id");
    if (auto m = model_ids.find(token.content); m != model_ids.end() && m->second != token.id)
      fail_field(path, field + ".id",
                 "is " + std::to_string(token.id) + " but model.vocab gives " + Json(token.content).dump() + " id " +
                     std::to_string(m->second),
                 "an added token present in the vocab must keep its vocab id");
    if (token.id > max_id) max_id = token.id, max_field = field + ".id";
    impl->added.push_back(std::move(token));
  }
  const auto n = static_cast<int32_t>(token_of_id.size());
  if (max_id >= n)
    fail_field(path, max_field,
               "is id " + std::to_string(max_id) + ", out of range: the file defines " + std::to_string(n) +
                   " tokens, so ids must run 0.." + std::to_string(n - 1),
               "ids must be dense; renumber the vocabulary or add the missing tokens");
  impl->tokens.resize(n);
  impl->in_model.assign(n, 0);
  for (auto& [id, token] : token_of_id) impl->tokens[id] = std::move(token);
  for (const auto& [token, id] : model_ids) impl->in_model[id] = 1;

  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    if (!model["unk_token"].is_string() || !model_ids.contains(model["unk_token"].get<std::string>()))
      fail_field(path, "model.unk_token", "is " + model["unk_token"].dump() + ", which is not in model.vocab",
                 "set \"unk_token\": null (byte-level vocabularies cover every byte) or name a vocab token");
    impl->unk_token = model["unk_token"].get<std::string>();
  }

  // Merges: "left right" strings (older files) or ["left", "right"] pairs (newer files).
  const Json& merges = require(model, "merges", path, "model", "the BPE model lists its merges as \"merges\": [...]");
  if (!merges.is_array())
    fail_field(path, "model.merges", "is not a list", "write merges as [\"a b\", ...] or [[\"a\", \"b\"], ...]");
  impl->merges.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const Json& merge = merges[rank];
    auto field = [rank] { return "model.merges[" + std::to_string(rank) + "]"; };
    std::string left, right;
    if (merge.is_string()) {
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail_field(path, field(), "is " + merge.dump() + ", not two tokens separated by one space",
                   "write the merge as \"left right\", or as [\"left\", \"right\"] when a token contains a space");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail_field(path, field(), "is " + merge.dump() + ", not a merge", "write the merge as \"left right\" or [\"left\", \"right\"]");
    }
    for (const std::string* part : {&left, &right}) {
      if (!model_ids.contains(*part))
        fail_field(path, field(), "merges " + Json(*part).dump() + ", which is not in model.vocab",
                   "every merge joins two vocab tokens; the merges and vocab come from different tokenizers "
                   "or the vocab was truncated");
    }
    if (!model_ids.contains(left + right))
      fail_field(path, field(), "makes " + Json(left + right).dump() + ", which is not in model.vocab",
                 "every merge result must be a vocab token; the merges and vocab come from different tokenizers");
    impl->merges.emplace_back(model_ids.at(left), model_ids.at(right));
  }

  impl->normalizer = root.contains("normalizer") ? root["normalizer"] : Json();
  check_normalizer(impl->normalizer, path);
  impl->pre_tokenizer = PreTokenizer::from_json(
      require(root, "pre_tokenizer", path, "", "byte-level BPE needs a ByteLevel pre-tokenizer"), path);
  // Kept verbatim for save(); they do not change ids (truncation and padding are not applied).
  const std::pair<const char*, Json*> passthrough[] = {{"version", &impl->version},
                                                       {"truncation", &impl->truncation},
                                                       {"padding", &impl->padding},
                                                       {"post_processor", &impl->post_processor},
                                                       {"decoder", &impl->decoder}};
  for (const auto& [key, slot] : passthrough)
    if (root.contains(key)) *slot = root[key];

  impl->index(names);
  return Tokenizer(std::move(impl));
}

void Tokenizer::save(const std::string& path) const {
  const Impl& m = *impl_;
  // Written by hand in Hugging Face's field order, one vocab entry and one merge per line;
  // small values are compact JSON.
  auto quote = [](const std::string& s) { return Json(s).dump(); };
  std::string out = "{\n";
  out += "  \"version\": " + m.version.dump() + ",\n";
  out += "  \"truncation\": " + m.truncation.dump() + ",\n";
  out += "  \"padding\": " + m.padding.dump() + ",\n";
  out += "  \"added_tokens\": [";
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& t = m.added[i];
    const nlohmann::ordered_json entry = {{"id", t.id},         {"content", t.content},       {"single_word", t.single_word},
                                          {"lstrip", t.lstrip}, {"rstrip", t.rstrip},         {"normalized", t.normalized},
                                          {"special", t.special}};
    out += (i ? ",\n    " : "\n    ") + entry.dump();
  }
  out += m.added.empty() ? "],\n" : "\n  ],\n";
  out += "  \"normalizer\": " + m.normalizer.dump() + ",\n";
  out += "  \"pre_tokenizer\": " + m.pre_tokenizer.config_json() + ",\n";
  out += "  \"post_processor\": " + m.post_processor.dump() + ",\n";
  out += "  \"decoder\": " + m.decoder.dump() + ",\n";
  out += "  \"model\": {\n";
  out += "    \"type\": \"BPE\",\n    \"dropout\": null,\n";
  out += "    \"unk_token\": " + (m.unk_token ? quote(*m.unk_token) : std::string("null")) + ",\n";
  out += "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n";
  out += std::string("    \"fuse_unk\": ") + (m.fuse_unk ? "true" : "false") + ",\n";
  out += "    \"byte_fallback\": false,\n";
  out += std::string("    \"ignore_merges\": ") + (m.ignore_merges ? "true" : "false") + ",\n";
  out += "    \"vocab\": {";
  bool first = true;
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    if (!m.in_model[id]) continue;
    out += (first ? "\n      " : ",\n      ") + quote(m.tokens[id]) + ": " + std::to_string(id);
    first = false;
  }
  out += first ? "},\n" : "\n    },\n";
  // Pairs rather than "left right" strings: a token may contain a space.
  out += "    \"merges\": [";
  for (size_t rank = 0; rank < m.merges.size(); ++rank) {
    const auto [left, right] = m.merges[rank];
    out += (rank ? ",\n      [" : "\n      [") + quote(m.tokens[left]) + ", " + quote(m.tokens[right]) + "]";
  }
  out += m.merges.empty() ? "]\n" : "\n    ]\n";
  out += "  }\n}\n";

  // Written beside the target and renamed, so a crash never leaves a half-written tokenizer.json.
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    TITAN_CHECK(file.good(), "cannot write tokenizer file '" + temporary + "'",
                "check that the directory exists and is writable");
    file << out;
    file.close();
    TITAN_CHECK(file.good(), "writing tokenizer file '" + temporary + "' failed", "check free disk space");
  }
  TITAN_CHECK(std::rename(temporary.c_str(), path.c_str()) == 0,
              "cannot rename '" + temporary + "' to '" + path + "'", "check that the target directory is writable");
}

// ---- training -------------------------------------------------------------------------------

Tokenizer Tokenizer::train(const std::vector<std::string>& texts, const TrainOptions& options) {
  size_t next = 0;
  return train(
      [&](std::string& text) {
        if (next == texts.size()) return false;
        text = texts[next++];
        return true;
      },
      options);
}

Tokenizer Tokenizer::train(const TextSource& next_text, const TrainOptions& options) {
  const int specials = static_cast<int>(options.special_tokens.size());
  TITAN_CHECK(options.vocab_size >= 256 + specials,
              "vocab_size " + std::to_string(options.vocab_size) + " is too small: the 256 byte tokens and " +
                  std::to_string(specials) + " special tokens alone need " + std::to_string(256 + specials),
              "pick a vocab size of a few thousand or more (Llama-3 uses 128256)");
  for (size_t i = 0; i < options.special_tokens.size(); ++i) {
    const std::string& token = options.special_tokens[i];
    TITAN_CHECK(!token.empty() && invalid_utf8_offset(token) == std::string::npos,
                "special token " + std::to_string(i) + " is empty or not valid UTF-8",
                "special tokens are short literal strings such as <|eos|>");
    TITAN_CHECK(std::count(options.special_tokens.begin(), options.special_tokens.end(), token) == 1,
                "special token '" + token + "' is listed twice", "list each special token once");
  }

  auto impl = std::make_shared<Impl>();
  impl->origin = "trained tokenizer";
  switch (options.pre_tokenizer) {
    case PreTokenizerStyle::gpt2:
      impl->pre_tokenizer = PreTokenizer::gpt2();
      break;
    case PreTokenizerStyle::llama3:
      impl->pre_tokenizer = PreTokenizer::llama3();
      break;
    case PreTokenizerStyle::deepseek_v3:
      impl->pre_tokenizer = PreTokenizer::deepseek_v3();
      break;
  }
  // Llama-3 marks its vocabulary this way: a word that is a token stays one token.
  impl->ignore_merges = options.pre_tokenizer == PreTokenizerStyle::llama3;

  WordCounts counts;
  std::string text;
  std::vector<std::string_view> words;
  std::deque<std::string> arena;
  for (size_t index = 0; next_text(text); ++index) {
    const size_t bad = invalid_utf8_offset(text);
    TITAN_CHECK(bad == std::string::npos,
                "training text " + std::to_string(index) + " is not valid UTF-8 at byte " + std::to_string(bad),
                "convert the corpus to UTF-8 (e.g. iconv) or drop the bad bytes before training");
    words.clear();
    arena.clear();
    impl->pre_tokenizer.split(text, words, arena);
    for (std::string_view word : words) ++counts[std::string(word)];
  }
  BpeVocabulary learned = train_bpe(counts, options.special_tokens, options.vocab_size, options.min_frequency);

  impl->tokens = std::move(learned.tokens);
  impl->in_model.assign(impl->tokens.size(), 1);
  impl->merges = std::move(learned.merges);
  for (int i = 0; i < specials; ++i)
    impl->added.push_back({.id = i, .content = options.special_tokens[i], .special = true});
  impl->decoder = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  impl->index(options.names);
  // With a BOS token, Hugging Face's encode(add_special_tokens=True) prepends it, as add_bos does here.
  if (impl->bos) {
    const std::string& bos = impl->tokens[*impl->bos];
    const Json bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
    impl->post_processor = {
        {"type", "TemplateProcessing"},
        {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_piece,
                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{bos, {{"id", bos}, {"ids", {*impl->bos}}, {"tokens", {bos}}}}}}};
  }
  return Tokenizer(std::move(impl));
}

}  // namespace titan::data
