// `titan tokenizer ...`: train a byte-level BPE tokenizer, or encode/decode with one.
#pragma once

namespace titan::cli {

// argv[0] is "tokenizer"; argv[1] is the action:
//   train  --input FILE... --vocab-size N --output tokenizer.json
//          [--special <|bos|>,<|eos|>] [--style llama3|gpt2|deepseek_v3] [--min-frequency N]
//   encode --tokenizer tokenizer.json --text "..." [--bos]
//   decode --tokenizer tokenizer.json --ids 1,2,3
// Returns the process exit code: 0 on success (or --help), 1 on a failure, 2 on a usage error.
int tokenizer_main(int argc, char** argv);

}  // namespace titan::cli
