// `titan generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
//  [--top-k K] [--top-p P] [--seed S] [--tokenizer tokenizer.json]`: KV-cached sampling from a
// checkpoint's model weights (its optimizer state is never read).
#pragma once

namespace titan::cli {

// argv[0] is "generate". Returns the process exit code: 0 done (or --help), 1 failed (the error
// is printed), 2 bad usage.
int generate_main(int argc, char** argv);

}  // namespace titan::cli
