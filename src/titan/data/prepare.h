// Turns text corpora into token shards: `titan data prepare`.
//
// Documents come from two kinds of input file, told apart by extension:
//   *.txt    one document per paragraph: a run of non-blank lines, ended by one or more blank
//            (empty or all-whitespace) lines or the end of the file. Lines inside a paragraph
//            are joined with '\n'. A file without blank lines is therefore one document.
//   *.jsonl  one JSON object per line; the document is its string field `jsonl_field`
//            ("text" by default). Blank lines are skipped; anything else that is not such an
//            object is an error naming file:line.
// A directory input stands for its *.txt and *.jsonl files in name order.
//
// Documents are numbered in input order; document i goes to validation when
// round((i + 1) * f) > round(i * f) for validation fraction f, which spreads exactly
// round(N * f) validation documents evenly through the corpus without knowing N in advance.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace titan::data {

// What preparing needs from a tokenizer. The real one (data/tokenizer.h) is wired in by the
// CLI; tests use a byte-level encoder.
struct Encoder {
  std::function<std::vector<int32_t>(std::string_view)> encode;
  int64_t vocab_size = 0;
  int32_t eos_id = -1;  // required: ends every document when the loader packs them
  int32_t bos_id = -1;  // -1: the tokenizer has no BOS and documents get none
};

struct PrepareOptions {
  std::vector<std::string> inputs;  // *.txt / *.jsonl files or directories of them
  std::string output_dir;           // receives train/, val/ and index.json
  std::string tokenizer_path;       // recorded in index.json so the shards can be traced back
  std::string jsonl_field = "text";
  double val_fraction = 0.01;
  int64_t shard_tokens = 100'000'000;  // a shard closes at the first document boundary past this
};

struct SplitSummary {
  int64_t documents = 0;
  int64_t tokens = 0;
  std::vector<std::string> shards;  // file names inside the split's directory
};

struct PrepareSummary {
  SplitSummary train, val;
};

// Writes <output_dir>/{train,val}/shard_NNNNNN.bin and <output_dir>/index.json. Everything is
// built in "<output_dir>.tmp" and renamed into place at the end, so an interrupted run leaves
// the previous dataset (if any) intact; an existing output_dir is replaced only when it holds
// an index.json, i.e. when it is itself a prepared dataset.
PrepareSummary prepare_dataset(const PrepareOptions& options, const Encoder& encoder);

}  // namespace titan::data
