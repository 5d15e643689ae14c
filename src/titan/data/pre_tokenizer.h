// Pre-tokenization: how text is cut into words before BPE merges bytes inside each word.
// Mirrors tokenizer.json's "pre_tokenizer": regex Splits and the ByteLevel step, in sequence.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace titan::data {

// A PCRE2 pattern compiled with UTF and UCP, so \p{L}, \p{N}, \s and \w follow Unicode as the
// Oniguruma patterns of Hugging Face tokenizers do; JIT-compiled where the platform allows.
// Copies share the compiled code; matching is thread-safe.
class Regex {
 public:
  explicit Regex(const std::string& pattern);
  // The leftmost match in `subject` starting at or after byte `offset`, as [begin, end).
  // `subject` must be valid UTF-8 (checked once by the caller, not per call).
  bool find(std::string_view subject, size_t offset, size_t& begin, size_t& end) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// What a Split step does with the pieces its pattern matches (tokenizer.json "behavior").
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

class PreTokenizer {
 public:
  // Builds the steps from tokenizer.json's "pre_tokenizer" value. `file` names the
  // tokenizer file in errors. The configuration must end in a ByteLevel step.
  static PreTokenizer from_json(const nlohmann::json& config, const std::string& file);
  // ByteLevel alone with its GPT-2 regex (GPT-2, RoBERTa).
  static PreTokenizer gpt2();
  // Split(Llama-3 regex, Isolated) then ByteLevel without its own regex (Llama-3).
  static PreTokenizer llama3();
  // Three Splits (DeepSeek-V3 patterns, Isolated) then ByteLevel without its own regex.
  static PreTokenizer deepseek_v3();

  // Appends the words of `text`, in order, to `words`. A view points into `text`, or into
  // `arena` for a word that gained a prefix space; both must outlive `words`.
  void split(std::string_view text, std::vector<std::string_view>& words, std::deque<std::string>& arena) const;

  // The tokenizer.json "pre_tokenizer" value this was built from, as JSON text.
  const std::string& config_json() const { return config_json_; }

 private:
  struct Step {
    bool byte_level = false;           // ByteLevel (else Split)
    bool add_prefix_space = false;     // ByteLevel: prepend ' ' to a piece not starting with one
    std::optional<Regex> regex;        // Split's pattern; ByteLevel's GPT-2 regex when use_regex
    SplitBehavior behavior = SplitBehavior::isolated;
    bool invert = false;               // the pattern matches the kept pieces, not the delimiters
  };
  static void add_steps(const nlohmann::json& config, const std::string& file, const std::string& field,
                        std::vector<Step>& steps);

  std::vector<Step> steps_;
  std::string config_json_;
};

}  // namespace titan::data
