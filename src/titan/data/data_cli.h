// `titan data ...`: the command-line face of data/ (prepare and inspect token shards).
#pragma once

#include <functional>
#include <string>

#include "titan/data/prepare.h"

namespace titan::data {

// Builds an Encoder from a tokenizer file. The `titan` binary passes one over
// data/tokenizer.h (Tokenizer::load + encode + eos_id); keeping it a parameter lets data/ be
// built and tested without the tokenizer.
using EncoderFactory = std::function<Encoder(const std::string& tokenizer_path)>;

// argv[0] is "data"; argv[1] the subcommand:
//   prepare --input PATH... --tokenizer tokenizer.json --output DIR
//           [--val-fraction 0.01] [--shard-tokens 100000000] [--jsonl-field text]
//   inspect PATH... [--verify]     (shards or directories of shards)
// Returns the process exit code: 0 done, 1 failed (the error is printed), 2 bad usage.
int data_main(int argc, char** argv, const EncoderFactory& make_encoder);

}  // namespace titan::data
