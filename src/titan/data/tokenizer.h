// Byte-level BPE tokenizer that reads and writes Hugging Face tokenizer.json (GPT-2, Llama-3,
// DeepSeek) and trains new ones. Ids match the `tokenizers` library exactly on the same file.
//
//   auto tok = titan::data::Tokenizer::load("tokenizer.json");
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_bos=*/true);
//   std::string text = tok.decode(ids);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// The tokens that open and close a document. An empty BOS name is taken from the BOS-adding
// post-processor when the file has one; otherwise empty names are looked up among well-known
// ones: <|begin_of_text|> / <|end_of_text|> (Llama-3), <｜begin▁of▁sentence｜> /
// <｜end▁of▁sentence｜> (DeepSeek), <|bos|> / <|eos|>, <s> / </s>, <|endoftext|> (GPT-2).
struct SpecialTokenNames {
  std::string bos = {};
  std::string eos = {};
};

// The regex a newly trained tokenizer cuts words with.
enum class PreTokenizerStyle {
  gpt2,    // ByteLevel's own regex: letters, digit runs, punctuation, each with one leading space
  llama3,  // Llama-3's Split regex: digits in groups of up to three, no space before digits
  deepseek_v3,  // DeepSeek-V3's three Splits: digit groups, CJK/kana runs, words with marks
};

struct TrainOptions {
  int vocab_size = 32000;  // all tokens: special tokens + 256 byte tokens + merges
  std::vector<std::string> special_tokens = {"<|bos|>", "<|eos|>"};
  PreTokenizerStyle pre_tokenizer = PreTokenizerStyle::llama3;
  int64_t min_frequency = 0;  // a pair must occur this often to be merged
  SpecialTokenNames names = {};  // which special tokens are BOS/EOS (empty: well-known names)
};

// Writes the next training text into `text` and returns true, or returns false at the end.
using TextSource = std::function<bool(std::string& text)>;

class Tokenizer {
 public:
  // Reads a tokenizer.json; throws titan::Error naming the file and field on anything it
  // cannot use exactly (other model types, normalizers, malformed vocab or merges).
  static Tokenizer load(const std::string& path, const SpecialTokenNames& names = {});
  // Trains on the texts as Hugging Face's BpeTrainer does (special tokens are not split out
  // of training text, as there).
  static Tokenizer train(const std::vector<std::string>& texts, const TrainOptions& options);
  static Tokenizer train(const TextSource& next_text, const TrainOptions& options);
  // Writes a tokenizer.json that Hugging Face `tokenizers` loads with the same ids.
  void save(const std::string& path) const;

  // Text must be valid UTF-8. Added tokens (e.g. "<|eot_id|>") written in the text become
  // their ids; add_bos prepends bos_id() (an error when the tokenizer has none).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;
  // The bytes the ids stand for; a cut through a multi-byte character leaves partial UTF-8.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t vocab_size() const;  // ids are 0 .. vocab_size() - 1, added tokens included
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Tokens as tokenizer.json writes them: byte-level characters ("Ġthe") for BPE tokens,
  // the literal text for added tokens.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<Impl> impl);
  // Shared so copies are cheap; the model is immutable and the word cache is thread-safe.
  std::shared_ptr<Impl> impl_;
};

}  // namespace titan::data
