#include "titan/data/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/data/byte_level.h"

namespace titan::data {

using Json = nlohmann::json;

namespace {

// The GPT-2 pattern the ByteLevel step splits with when its use_regex is true.
const char* const kGpt2SplitPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3: digits in groups of up to three, letters with one leading non-letter.
const char* const kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek-V3, applied in turn: digit groups, CJK/kana runs, then words keeping their marks.
const char* const kDeepSeekV3SplitPatterns[3] = {
    R"(\p{N}{1,3})",
    "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re",
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Match state is per thread and independent of the pattern: one ovector pair is all `find`
// reads, and a JIT stack large enough for long whitespace runs under lookahead.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, jit_stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

// Escapes a literal for a Split whose pattern is {"String": ...}.
std::string escape_literal(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                             &error, &error_offset, nullptr);
  TITAN_CHECK(code->code != nullptr,
              "cannot compile pre-tokenizer regex '" + pattern + "' at offset " + std::to_string(error_offset) + ": " +
                  pcre2_message(error),
              "the pattern must be valid PCRE2 syntax (Oniguruma patterns from tokenizer.json usually are)");
  // Without JIT (some platforms forbid executable memory) the interpreter gives the same matches.
  pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  code_ = std::move(code);
}

bool Regex::find(std::string_view subject, size_t offset, size_t& begin, size_t& end) const {
  thread_local MatchScratch scratch;
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), offset,
                             PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  TITAN_CHECK(rc >= 0, "pre-tokenizer regex '" + pattern_ + "' failed on a " + std::to_string(subject.size()) +
                           "-byte piece: " + pcre2_message(rc),
              "split very long runs of one character class (e.g. whitespace) before tokenizing");
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

namespace {

// Cuts `piece` at the matches of `regex` and keeps the pieces `behavior` asks for, dropping
// empty ones, as Hugging Face's Split pre-tokenizer does.
void split_piece(std::string_view piece, const Regex& regex, SplitBehavior behavior, bool invert,
                 std::vector<std::string_view>& out) {
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t last = 0;
  size_t offset = 0;
  size_t begin = 0, end = 0;
  while (offset <= piece.size() && regex.find(piece, offset, begin, end)) {
    if (begin > last) spans.push_back({last, begin, invert});
    spans.push_back({begin, end, !invert});
    last = end;
    if (end > begin) {
      offset = end;
    } else {
      // An empty match: step over one character so the search moves on.
      if (end == piece.size()) break;
      size_t next = end;
      next_code_point(piece, next);
      offset = next;
    }
  }
  if (last < piece.size()) spans.push_back({last, piece.size(), invert});

  // Pieces as [begin, end) after the behavior joins delimiters to neighbours or drops them.
  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::isolated:
      for (const Span& s : spans) kept.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::removed:
      for (const Span& s : spans)
        if (!s.is_match) kept.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::contiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::merged_with_previous:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
        if (s->is_match && !previous_match && !kept.empty()) {
          kept.back().first = s->begin;
        } else {
          kept.emplace_back(s->begin, s->end);
        }
        previous_match = s->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
  }
  for (const auto& [b, e] : kept)
    if (e > b) out.push_back(piece.substr(b, e - b));
}

SplitBehavior parse_behavior(const Json& value, const std::string& file, const std::string& field) {
  const std::string name = value.is_string() ? value.get<std::string>() : "";
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  TITAN_FAIL("tokenizer file '" + file + "': field '" + field + "' is " + value.dump() + ", not a split behavior",
             "use one of \"Removed\", \"Isolated\", \"MergedWithPrevious\", \"MergedWithNext\", \"Contiguous\"");
}

bool bool_field(const Json& object, const char* key, bool fallback, const std::string& file, const std::string& field) {
  if (!object.contains(key) || object[key].is_null()) return fallback;
  TITAN_CHECK(object[key].is_boolean(),
              "tokenizer file '" + file + "': field '" + field + "." + key + "' is " + object[key].dump() +
                  ", not true/false",
              "write true or false");
  return object[key].get<bool>();
}

}  // namespace

void PreTokenizer::add_steps(const Json& config, const std::string& file, const std::string& field,
                             std::vector<Step>& steps) {
  const std::string type = config.is_object() && config.contains("type") && config["type"].is_string()
                               ? config["type"].get<std::string>()
                               : "";
  if (type == "Sequence") {
    const std::string list_field = field + ".pretokenizers";
    TITAN_CHECK(config.contains("pretokenizers") && config["pretokenizers"].is_array(),
                "tokenizer file '" + file + "': field '" + list_field + "' is missing or not a list",
                "a Sequence pre-tokenizer lists its steps under \"pretokenizers\"");
    for (size_t i = 0; i < config["pretokenizers"].size(); ++i)
      add_steps(config["pretokenizers"][i], file, list_field + "[" + std::to_string(i) + "]", steps);
    return;
  }
  Step step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    // Hugging Face's defaults for a ByteLevel written without these fields.
    step.add_prefix_space = bool_field(config, "add_prefix_space", true, file, field);
    if (bool_field(config, "use_regex", true, file, field)) step.regex.emplace(kGpt2SplitPattern);
  } else if (type == "Split") {
    const std::string pattern_field = field + ".pattern";
    TITAN_CHECK(config.contains("pattern") && config["pattern"].is_object(),
                "tokenizer file '" + file + "': field '" + pattern_field + "' is missing or not an object",
                "write the pattern as {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    const Json& pattern = config["pattern"];
    std::string regex;
    if (pattern.contains("Regex") && pattern["Regex"].is_string()) {
      regex = pattern["Regex"].get<std::string>();
    } else if (pattern.contains("String") && pattern["String"].is_string()) {
      regex = escape_literal(pattern["String"].get<std::string>());
    } else {
      TITAN_FAIL("tokenizer file '" + file + "': field '" + pattern_field + "' is " + pattern.dump() +
                     ", which has neither a \"Regex\" nor a \"String\" text",
                 "write the pattern as {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    }
    try {
      step.regex.emplace(regex);
    } catch (const Error& e) {
      TITAN_FAIL("tokenizer file '" + file + "': field '" + pattern_field + "': " + e.message(), e.hint());
    }
    TITAN_CHECK(config.contains("behavior"), "tokenizer file '" + file + "': field '" + field + ".behavior' is missing",
                "add \"behavior\": \"Isolated\" (what Llama-3 and DeepSeek use)");
    step.behavior = parse_behavior(config["behavior"], file, field + ".behavior");
    step.invert = bool_field(config, "invert", false, file, field);
  } else {
    TITAN_FAIL("tokenizer file '" + file + "': field '" + field + "' is a pre-tokenizer of type '" +
                   (type.empty() ? config.dump() : type) + "', which byte-level BPE does not use",
               "titan reads byte-level BPE tokenizers (GPT-2, Llama-3, DeepSeek): the pre_tokenizer must be "
               "ByteLevel, or a Sequence of Split steps ending in ByteLevel");
  }
  TITAN_CHECK(steps.empty() || !steps.back().byte_level,
              "tokenizer file '" + file + "': field '" + field + "' comes after the ByteLevel step",
              "steps after ByteLevel would see byte-mapped characters; put ByteLevel last in the Sequence");
  steps.push_back(std::move(step));
}

PreTokenizer PreTokenizer::from_json(const Json& config, const std::string& file) {
  TITAN_CHECK(!config.is_null(), "tokenizer file '" + file + "': field 'pre_tokenizer' is null",
              "byte-level BPE needs a ByteLevel pre-tokenizer; this file is probably a SentencePiece-style "
              "tokenizer (Llama-2, Mistral), which titan does not read");
  PreTokenizer out;
  add_steps(config, file, "pre_tokenizer", out.steps_);
  TITAN_CHECK(!out.steps_.empty() && out.steps_.back().byte_level,
              "tokenizer file '" + file + "': field 'pre_tokenizer' has no ByteLevel step",
              "byte-level BPE maps bytes to characters in a final ByteLevel step; add "
              "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false} at the end");
  out.config_json_ = config.dump();
  return out;
}

PreTokenizer PreTokenizer::gpt2() {
  const Json config = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return from_json(config, "<gpt2 pre-tokenizer>");
}

PreTokenizer PreTokenizer::llama3() {
  const Json config = {
      {"type", "Sequence"},
      {"pretokenizers",
       Json::array({{{"type", "Split"}, {"pattern", {{"Regex", kLlama3SplitPattern}}}, {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  return from_json(config, "<llama3 pre-tokenizer>");
}

PreTokenizer PreTokenizer::deepseek_v3() {
  Json steps = Json::array();
  for (const char* pattern : kDeepSeekV3SplitPatterns)
    steps.push_back({{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}});
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}});
  return from_json({{"type", "Sequence"}, {"pretokenizers", steps}}, "<deepseek_v3 pre-tokenizer>");
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words,
                         std::deque<std::string>& arena) const {
  std::vector<std::string_view> pieces;
  std::vector<std::string_view> next;
  if (!text.empty()) pieces.push_back(text);
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      if (step.byte_level && step.add_prefix_space && piece.front() != ' ') {
        std::string& prefixed = arena.emplace_back();
        prefixed.reserve(piece.size() + 1);
        prefixed += ' ';
        prefixed += piece;
        piece = prefixed;
      }
      if (step.regex) {
        split_piece(piece, *step.regex, step.behavior, step.invert, next);
      } else {
        next.push_back(piece);
      }
    }
    pieces.swap(next);
  }
  words.insert(words.end(), pieces.begin(), pieces.end());
}

}  // namespace titan::data
