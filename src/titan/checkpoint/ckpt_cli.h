// `titan ckpt ...`: checkpoint conversion between Hugging Face folders and our training
// checkpoints. It sits in checkpoint/ beside the formats it converts, but reads model
// architectures through models/ (each model's hf_adapter), so it is the one file here that
// includes a layer above; the `titan` binary (cli/) calls it.
#pragma once

namespace titan::checkpoint {

// argv[0] is "ckpt"; argv[1] the subcommand:
//   convert --from-hf HF_DIR --to CKPT_ROOT [--step N]
//   convert --from CKPT --to-hf HF_DIR [--flavor NAME] [--dtype bf16|f16|f32] [--max-shard-bytes N]
// Only model "deepseek_v3" for now. Returns the process exit code: 0 done, 1 failed (the error
// is printed), 2 bad usage.
int ckpt_main(int argc, char** argv);

}  // namespace titan::checkpoint
