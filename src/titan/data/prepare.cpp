#include "titan/data/prepare.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "titan/core/error.h"
#include "titan/data/shard.h"

namespace titan::data {
namespace fs = std::filesystem;

namespace {

enum class InputKind { text, jsonl };

InputKind input_kind(const fs::path& file) {
  const std::string ext = file.extension().string();
  if (ext == ".txt") return InputKind::text;
  if (ext == ".jsonl") return InputKind::jsonl;
  TITAN_FAIL(fmt::format("input {} is neither .txt nor .jsonl", file.string()),
             "pass plain-text files (*.txt, one document per paragraph) or JSON Lines files (*.jsonl)");
}

// Expands directories to their *.txt / *.jsonl files in name order, so a run is reproducible
// whatever order the file system lists them in.
std::vector<fs::path> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& input : inputs) {
    const fs::path path(input);
    TITAN_CHECK(fs::exists(path), fmt::format("input {} does not exist", input),
                "check the --input path (for the default corpus run scripts/prepare_corpus.sh first)");
    if (!fs::is_directory(path)) {
      input_kind(path);
      files.push_back(path);
      continue;
    }
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(path)) {
      const std::string ext = entry.path().extension().string();
      if (entry.is_regular_file() && (ext == ".txt" || ext == ".jsonl")) found.push_back(entry.path());
    }
    TITAN_CHECK(!found.empty(), fmt::format("input directory {} holds no .txt or .jsonl files", input),
                "point --input at the corpus files themselves or at a directory that holds them");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

void strip_carriage_return(std::string& line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); });
}

std::ifstream open_input(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  TITAN_CHECK(in.good(), fmt::format("cannot open input {}", file.string()), "check that the file is readable");
  return in;
}

template <class Emit>
void read_text_documents(const fs::path& file, Emit&& emit) {
  std::ifstream in = open_input(file);
  std::string line, document;
  while (std::getline(in, line)) {
    strip_carriage_return(line);
    if (is_blank(line)) {
      if (!document.empty()) emit(document);
      document.clear();
      continue;
    }
    if (!document.empty()) document += '\n';
    document += line;
  }
  if (!document.empty()) emit(document);
}

template <class Emit>
void read_jsonl_documents(const fs::path& file, const std::string& field, Emit&& emit) {
  std::ifstream in = open_input(file);
  std::string line;
  for (int64_t line_number = 1; std::getline(in, line); ++line_number) {
    strip_carriage_return(line);
    if (is_blank(line)) continue;
    const std::string where = fmt::format("{}:{}", file.string(), line_number);
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for "1e400"
      TITAN_FAIL(fmt::format("{}: not valid JSON ({})", where, e.what()),
                 "each line of a .jsonl file must be one complete JSON object; fix or remove that line");
    }
    TITAN_CHECK(record.is_object(), fmt::format("{}: the line is JSON but not an object", where),
                fmt::format("each line must look like {{\"{}\": \"...\"}}", field));
    const auto it = record.find(field);
    TITAN_CHECK(it != record.end() && it->is_string(),
                fmt::format("{}: no string field \"{}\"", where, field),
                "pass --jsonl-field with the name of the field that holds the text");
    const std::string& text = it->get_ref<const std::string&>();
    if (!text.empty()) emit(text);
  }
}

// Writes one split's shards, opening the next shard when the current one is full.
class SplitWriter {
 public:
  SplitWriter(fs::path dir, const PrepareOptions& options, const Encoder& encoder)
      : dir_(std::move(dir)), options_(options), encoder_(encoder) {
    fs::create_directories(dir_);
  }

  void add(const std::vector<int32_t>& tokens) {
    if (!shard_) {
      summary_.shards.push_back(fmt::format("shard_{:06d}.bin", summary_.shards.size()));
      shard_ = std::make_unique<ShardWriter>((dir_ / summary_.shards.back()).string(), encoder_.vocab_size,
                                             encoder_.bos_id, encoder_.eos_id);
    }
    shard_->add_document(tokens);
    summary_.documents += 1;
    summary_.tokens += int64_t(tokens.size());
    if (shard_->num_tokens() >= options_.shard_tokens) close_shard();
  }

  SplitSummary finish() {
    close_shard();
    return summary_;
  }

 private:
  void close_shard() {
    if (!shard_) return;
    shard_->finish();
    spdlog::info("data prepare: {}/{}: {} documents, {} tokens", dir_.filename().string(), summary_.shards.back(),
                 shard_->num_documents(), shard_->num_tokens());
    shard_.reset();
  }

  fs::path dir_;
  const PrepareOptions& options_;
  const Encoder& encoder_;
  std::unique_ptr<ShardWriter> shard_;
  SplitSummary summary_;
};

nlohmann::json split_json(const SplitSummary& split) {
  return {{"documents", split.documents}, {"tokens", split.tokens}, {"shards", split.shards}};
}

// Swaps the finished staging directory in for the output, keeping the old dataset until the
// new one is in place.
void publish(const fs::path& staging, const fs::path& output) {
  if (!fs::exists(output)) {
    fs::rename(staging, output);
    return;
  }
  const fs::path retired = output.string() + ".old";
  fs::remove_all(retired);
  fs::rename(output, retired);
  fs::rename(staging, output);
  fs::remove_all(retired);
}

// Tokenizes every input into <staging>/{train,val}/ and writes <staging>/index.json.
PrepareSummary write_dataset(const fs::path& staging, const std::vector<fs::path>& files,
                             const PrepareOptions& options, const Encoder& encoder) {
  PrepareSummary summary;
  {
    SplitWriter train(staging / "train", options, encoder);
    SplitWriter val(staging / "val", options, encoder);
    const double f = options.val_fraction;
    int64_t index = 0;
    auto emit = [&](const std::string& text) {
      const bool to_val = std::floor((index + 1) * f + 0.5) > std::floor(index * f + 0.5);
      (to_val ? val : train).add(encoder.encode(text));
      ++index;
    };
    for (const fs::path& file : files) {
      if (input_kind(file) == InputKind::text) {
        read_text_documents(file, emit);
      } else {
        read_jsonl_documents(file, options.jsonl_field, emit);
      }
    }
    summary.train = train.finish();
    summary.val = val.finish();
  }
  TITAN_CHECK(summary.train.documents > 0, "data prepare: the inputs hold no documents for training",
              "check the inputs: .txt paragraphs must be non-blank, .jsonl records need a non-empty text field");
  TITAN_CHECK(options.val_fraction == 0 || summary.val.documents > 0,
              fmt::format("data prepare: {} documents x validation fraction {} rounds to no validation document",
                          summary.train.documents, options.val_fraction),
              "raise --val-fraction, split the text into more documents, or pass --val-fraction 0");

  const nlohmann::json index = {
      {"format", "titan token shards"},
      {"format_version", kShardVersion},
      {"tokenizer", options.tokenizer_path},
      {"vocab_size", encoder.vocab_size},
      {"bos_id", encoder.bos_id},
      {"eos_id", encoder.eos_id},
      {"token_bytes", token_bytes_for_vocab(encoder.vocab_size)},
      {"val_fraction", options.val_fraction},
      {"inputs", [&] {
         std::vector<std::string> names;
         for (const fs::path& file : files) names.push_back(file.string());
         return names;
       }()},
      {"train", split_json(summary.train)},
      {"val", split_json(summary.val)},
  };
  {
    std::ofstream out(staging / "index.json");
    out << index.dump(2) << '\n';
    TITAN_CHECK(out.good(), fmt::format("data prepare: cannot write {}", (staging / "index.json").string()),
                "check free disk space and permissions");
  }
  return summary;
}

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& options, const Encoder& encoder) {
  TITAN_CHECK(bool(encoder.encode), "data prepare: no encode function", "pass the tokenizer's encode function");
  TITAN_CHECK(options.val_fraction >= 0 && options.val_fraction < 1,
              fmt::format("data prepare: validation fraction {} is outside [0, 1)", options.val_fraction),
              "use e.g. --val-fraction 0.01 (0 for no validation split)");
  TITAN_CHECK(options.shard_tokens > 0, fmt::format("data prepare: shard size {} tokens", options.shard_tokens),
              "use a positive --shard-tokens, e.g. 100000000");
  TITAN_CHECK(!options.output_dir.empty(), "data prepare: no output directory", "pass --output DIR");
  const std::vector<fs::path> files = expand_inputs(options.inputs);
  TITAN_CHECK(!files.empty(), "data prepare: no inputs", "pass at least one --input FILE");

  const fs::path output = fs::path(options.output_dir).lexically_normal();
  const fs::path out_dir = output.has_filename() ? output : output.parent_path();
  TITAN_CHECK(!fs::exists(out_dir) || fs::exists(out_dir / "index.json") ||
                  (fs::is_directory(out_dir) && fs::is_empty(out_dir)),
              fmt::format("data prepare: output {} exists and is not a prepared dataset (no index.json)",
                          out_dir.string()),
              "pass a new or empty directory; prepare only replaces directories it made itself");
  const fs::path staging = out_dir.string() + ".tmp";
  fs::remove_all(staging);

  PrepareSummary summary;
  try {
    summary = write_dataset(staging, files, options, encoder);
    publish(staging, out_dir);
  } catch (...) {
    std::error_code ignored;  // the original error is the one worth reporting
    fs::remove_all(staging, ignored);
    throw;
  }
  spdlog::info("data prepare: {} -> train {} documents / {} tokens, val {} documents / {} tokens",
               out_dir.string(), summary.train.documents, summary.train.tokens, summary.val.documents,
               summary.val.tokens);
  return summary;
}

}  // namespace titan::data
