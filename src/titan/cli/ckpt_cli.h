// `titan ckpt ...`: checkpoint conversion between Hugging Face folders and our training
// checkpoints, through each model's hf_adapter.
#pragma once

namespace titan::cli {

// argv[0] is "ckpt"; argv[1] the subcommand:
//   convert --from-hf HF_DIR --to CKPT_ROOT [--step N]
//   convert --from CKPT --to-hf HF_DIR [--flavor NAME] [--dtype bf16|f16|f32] [--max-shard-bytes N]
// Models deepseek_v3 and deepseek_v32. Returns the process exit code: 0 done (or --help), 1
// failed (the error is printed), 2 bad usage.
int ckpt_main(int argc, char** argv);

}  // namespace titan::cli
