#include "titan/cli/tokenizer_cli.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"

namespace titan::cli {

using namespace data;

namespace {

constexpr const char* kUsage = R"(usage:
  titan tokenizer train  --input FILE... --vocab-size N --output tokenizer.json
                         [--special <|bos|>,<|eos|>] [--style llama3|gpt2|deepseek_v3] [--min-frequency N]
  titan tokenizer encode --tokenizer tokenizer.json --text TEXT [--bos]
  titan tokenizer decode --tokenizer tokenizer.json --ids 1,2,3

train   learns a byte-level BPE vocabulary from UTF-8 text files and writes a Hugging Face
        tokenizer.json. --special lists special tokens (ids 0, 1, ...; default <|bos|>,<|eos|>,
        the first being BOS and the second EOS); --style picks the pre-tokenizer regex
        (llama3, the default, gpt2 or deepseek_v3).
encode  prints the ids of TEXT, space-separated (--bos prepends the BOS token).
decode  prints the text of comma-separated ids.
)";

// Options as name -> values; a flag that takes no value maps to an empty list. `--name=value`
// passes a value that itself starts with "--".
std::map<std::string, std::vector<std::string>> parse_options(int argc, char** argv, int first,
                                                              const std::vector<std::string>& flags) {
  std::map<std::string, std::vector<std::string>> options;
  std::vector<std::string>* current = nullptr;
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) == 0) {
      const size_t equals = arg.find('=');
      const std::string name = arg.substr(2, equals == std::string::npos ? std::string::npos : equals - 2);
      current = &options[name];
      if (equals != std::string::npos) {
        current->push_back(arg.substr(equals + 1));
        current = nullptr;
      } else if (std::find(flags.begin(), flags.end(), name) != flags.end()) {
        current = nullptr;
      }
    } else if (current) {
      current->push_back(arg);
    } else {
      throw UsageError{"unexpected argument '" + arg + "'"};
    }
  }
  return options;
}

const std::string& single(const std::map<std::string, std::vector<std::string>>& options, const std::string& name) {
  auto it = options.find(name);
  if (it == options.end() || it->second.size() != 1) throw UsageError{"--" + name + " takes exactly one value"};
  return it->second.front();
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(list.substr(start, comma - start));
  out.push_back(list.substr(start));
  return out;
}

int64_t parse_integer(const std::string& text, const std::string& name) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw UsageError{"--" + name + " needs an integer, not '" + text + "'"};
  return value;
}

// Streams training texts from files: paragraphs (up to a blank line) with their newlines, so
// newline runs are learned as tokens, capped at 1 MiB so a file without blank lines still
// streams in bounded memory.
class FileTexts {
 public:
  explicit FileTexts(std::vector<std::string> paths) : paths_(std::move(paths)) {}

  bool next(std::string& text) {
    text.clear();
    std::string line;
    while (true) {
      if (!in_.is_open()) {
        if (next_path_ == paths_.size()) return !text.empty();
        const std::string& path = paths_[next_path_++];
        in_.open(path, std::ios::binary);
        TITAN_CHECK(in_.is_open(), "cannot open training text '" + path + "'",
                    "check the path given to --input; it must be a readable UTF-8 text file");
      }
      if (!std::getline(in_, line)) {
        in_.close();
        if (!text.empty()) return true;
        continue;
      }
      text += line;
      bytes_ += line.size();
      if (!in_.eof()) {
        text += '\n';
        ++bytes_;
      }
      if (line.empty() || text.size() >= kMaxTextBytes) return true;
    }
  }

  size_t bytes() const { return bytes_; }

 private:
  static constexpr size_t kMaxTextBytes = 1 << 20;
  std::vector<std::string> paths_;
  size_t next_path_ = 0;
  std::ifstream in_;
  size_t bytes_ = 0;
};

int train(int argc, char** argv) {
  const auto options = parse_options(argc, argv, 2, {});
  for (const auto& [name, values] : options) {
    if (name != "input" && name != "vocab-size" && name != "output" && name != "special" && name != "style" &&
        name != "min-frequency")
      throw UsageError{"train has no option --" + name};
  }
  if (!options.contains("input") || options.at("input").empty()) throw UsageError{"train needs --input FILE..."};
  TrainOptions train_options;
  train_options.vocab_size = static_cast<int>(parse_integer(single(options, "vocab-size"), "vocab-size"));
  const std::string& output = single(options, "output");
  if (options.contains("special")) {
    train_options.special_tokens = split_commas(single(options, "special"));
    // The first two special tokens are BOS and EOS, whatever their names.
    if (!train_options.special_tokens.empty()) train_options.names.bos = train_options.special_tokens[0];
    if (train_options.special_tokens.size() > 1) train_options.names.eos = train_options.special_tokens[1];
  }
  if (options.contains("style")) {
    const std::string& style = single(options, "style");
    const std::map<std::string, PreTokenizerStyle> styles = {
        {"llama3", PreTokenizerStyle::llama3}, {"gpt2", PreTokenizerStyle::gpt2},
        {"deepseek_v3", PreTokenizerStyle::deepseek_v3}};
    auto it = styles.find(style);
    if (it == styles.end()) throw UsageError{"--style is llama3, gpt2 or deepseek_v3, not '" + style + "'"};
    train_options.pre_tokenizer = it->second;
  }
  if (options.contains("min-frequency"))
    train_options.min_frequency = parse_integer(single(options, "min-frequency"), "min-frequency");

  const auto start = std::chrono::steady_clock::now();
  FileTexts texts(options.at("input"));
  const Tokenizer tokenizer =
      Tokenizer::train([&](std::string& text) { return texts.next(text); }, train_options);
  tokenizer.save(output);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("trained {} tokens on {:.1f} MB of text in {:.1f} s; wrote {}\n", tokenizer.vocab_size(),
             static_cast<double>(texts.bytes()) / 1e6, seconds, output);
  return 0;
}

int encode(int argc, char** argv) {
  const auto options = parse_options(argc, argv, 2, {"bos"});
  for (const auto& [name, values] : options)
    if (name != "tokenizer" && name != "text" && name != "bos") throw UsageError{"encode has no option --" + name};
  const Tokenizer tokenizer = Tokenizer::load(single(options, "tokenizer"));
  const std::vector<int32_t> ids = tokenizer.encode(single(options, "text"), options.contains("bos"));
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  fmt::print("{}\n", line);
  return 0;
}

int decode(int argc, char** argv) {
  const auto options = parse_options(argc, argv, 2, {});
  for (const auto& [name, values] : options)
    if (name != "tokenizer" && name != "ids") throw UsageError{"decode has no option --" + name};
  const Tokenizer tokenizer = Tokenizer::load(single(options, "tokenizer"));
  std::vector<int32_t> ids;
  for (const std::string& id : split_commas(single(options, "ids")))
    ids.push_back(static_cast<int32_t>(parse_integer(id, "ids")));
  fmt::print("{}\n", tokenizer.decode(ids));
  return 0;
}

}  // namespace

int tokenizer_main(int argc, char** argv) {
  const std::string action = argc > 1 ? argv[1] : "";
  return run_command("tokenizer", kUsage, [&] {
    if (action == "--help" || action == "-h" || action == "help" || wants_help(arguments(argc, argv, 2))) {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (action == "train") return train(argc, argv);
    if (action == "encode") return encode(argc, argv);
    if (action == "decode") return decode(argc, argv);
    throw UsageError{action.empty() ? "missing action" : "unknown action '" + action + "'"};
  });
}

}  // namespace titan::cli
