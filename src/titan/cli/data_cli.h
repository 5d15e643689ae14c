// `titan data ...`: prepare and inspect token shards.
#pragma once

#include <functional>
#include <string>

#include "titan/data/prepare.h"

namespace titan::cli {

// Builds an Encoder from a tokenizer file. The `titan` binary passes one over
// data/tokenizer.h (Tokenizer::load + encode + eos_id); tests pass their own (e.g. bytes as ids).
using EncoderFactory = std::function<data::Encoder(const std::string& tokenizer_path)>;

// argv[0] is "data"; argv[1] the subcommand:
//   prepare --input PATH... --tokenizer tokenizer.json --output DIR
//           [--val-fraction 0.01] [--shard-tokens 100000000] [--jsonl-field text]
//   inspect PATH... [--verify]     (shards or directories of shards)
// Returns the process exit code: 0 done (or --help), 1 failed (the error is printed), 2 bad usage.
int data_main(int argc, char** argv, const EncoderFactory& make_encoder);

}  // namespace titan::cli
