#include "titan/cli/data_cli.h"

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "titan/cli/args.h"
#include "titan/data/shard.h"

namespace titan::cli {

using namespace data;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: titan data prepare --input PATH... --tokenizer tokenizer.json --output DIR\n"
    "                          [--val-fraction 0.01] [--shard-tokens 100000000] [--jsonl-field text]\n"
    "       titan data inspect PATH... [--verify]\n"
    "\n"
    "prepare  tokenizes .txt (one document per paragraph) and .jsonl (one document per line) files\n"
    "         into DIR/train/*.bin, DIR/val/*.bin and DIR/index.json\n"
    "inspect  prints the header of each shard (or of every shard in a directory); --verify also\n"
    "         checks checksums and token ids\n";

int prepare_main(const std::vector<std::string_view>& args, const EncoderFactory& make_encoder) {
  PrepareOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) throw UsageError{fmt::format("{} needs a value", arg)};
      return args[++i];
    };
    if (arg == "--input") {
      options.inputs.emplace_back(value());
      // `--input a.txt b.jsonl` takes every word up to the next flag.
      while (i + 1 < args.size() && !args[i + 1].starts_with("--")) options.inputs.emplace_back(args[++i]);
    } else if (arg == "--tokenizer") {
      options.tokenizer_path = value();
    } else if (arg == "--output") {
      options.output_dir = value();
    } else if (arg == "--val-fraction") {
      options.val_fraction = parse_number<double>(arg, value());
    } else if (arg == "--shard-tokens") {
      options.shard_tokens = parse_number<int64_t>(arg, value());
    } else if (arg == "--jsonl-field") {
      options.jsonl_field = value();
    } else {
      throw UsageError{fmt::format("unknown argument '{}'", arg)};
    }
  }
  if (options.inputs.empty()) throw UsageError{"prepare needs --input"};
  if (options.tokenizer_path.empty()) throw UsageError{"prepare needs --tokenizer"};
  if (options.output_dir.empty()) throw UsageError{"prepare needs --output"};
  const Encoder encoder = make_encoder(options.tokenizer_path);
  const PrepareSummary summary = prepare_dataset(options, encoder);
  fmt::print("prepared {}: train {} documents, {} tokens in {} shards; val {} documents, {} tokens in {} shards\n",
             options.output_dir, summary.train.documents, summary.train.tokens, summary.train.shards.size(),
             summary.val.documents, summary.val.tokens, summary.val.shards.size());
  return 0;
}

int inspect_main(const std::vector<std::string_view>& args) {
  bool verify = false;
  std::vector<std::string> paths;
  for (const std::string_view arg : args) {
    if (arg == "--verify") {
      verify = true;
    } else if (arg.starts_with("--")) {
      throw UsageError{fmt::format("unknown argument '{}'", arg)};
    } else if (fs::is_directory(arg)) {
      std::vector<std::string> found;
      for (const auto& entry : fs::directory_iterator(arg))
        if (entry.path().extension() == ".bin") found.push_back(entry.path().string());
      std::sort(found.begin(), found.end());
      paths.insert(paths.end(), found.begin(), found.end());
    } else {
      paths.emplace_back(arg);
    }
  }
  if (paths.empty()) throw UsageError{"inspect needs a shard file or a directory of shards"};
  for (const std::string& path : paths) {
    const ShardReader shard(path, verify);
    const ShardHeader& h = shard.header();
    fmt::print("{}: version {}, {} tokens ({}-bit), {} documents, vocab {}, BOS {}, EOS {}, checksum {:016x}{}\n",
               path, h.version, h.num_tokens, 8 * h.token_bytes, h.num_documents, h.vocab_size, h.bos_id, h.eos_id,
               h.checksum, verify ? " (verified)" : "");
  }
  return 0;
}

}  // namespace

int data_main(int argc, char** argv, const EncoderFactory& make_encoder) {
  const std::vector<std::string_view> args = arguments(argc, argv, 2);
  const std::string_view command = argc >= 2 ? std::string_view(argv[1]) : std::string_view();
  return run_command("data", kUsage, [&] {
    if (command == "-h" || command == "--help" || command == "help" || wants_help(args)) {
      fmt::print("{}", kUsage);
      return 0;
    }
    if (command == "prepare") return prepare_main(args, make_encoder);
    if (command == "inspect") return inspect_main(args);
    throw UsageError{command.empty() ? "missing subcommand" : fmt::format("unknown subcommand '{}'", command)};
  });
}

}  // namespace titan::cli
