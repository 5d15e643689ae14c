#include "titan/cli/ckpt_cli.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "titan/checkpoint/checkpoint.h"
#include "titan/checkpoint/hf.h"
#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/train/hf_checkpoint.h"

namespace titan::cli {

using namespace checkpoint;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: titan ckpt convert --from-hf HF_DIR --to CKPT_ROOT [--step N]\n"
    "       titan ckpt convert --from CKPT --to-hf HF_DIR [--flavor NAME] [--dtype bf16|f16|f32]\n"
    "                          [--max-shard-bytes N] [--quantize fp8|fp8-fp4]\n"
    "\n"
    "--from-hf  reads a Hugging Face DeepSeek-V3, V3.2 or V4 folder (config.json, model.safetensors or\n"
    "           a sharded index; FP8 block-quantized weights are dequantized) and writes CKPT_ROOT/step-N/;\n"
    "           V3's MTP layers come along when the folder has their weights (DeepSeek's has; one that\n"
    "           transformers' save_pretrained wrote has none: train with --model.mtp_layers to start\n"
    "           MTP fresh); V4 is read in transformers' naming or DeepSeek's (what save_pretrained\n"
    "           writes), without MTP\n"
    "--to-hf    writes a training checkpoint (a step folder, or a root holding step folders) as a\n"
    "           Hugging Face folder: config.json, shards of at most --max-shard-bytes (5 GiB) and\n"
    "           model.safetensors.index.json. The architecture comes from the checkpoint when it was\n"
    "           converted from HF, else from --flavor (or the [model] flavor of its config.toml)\n"
    "--quantize stores the weights as DeepSeek releases them: fp8, the blocks' projections in E4M3\n"
    "           with a scale per 128 x 128 block (V3 / V3.2: f32 '_scale_inv'; V4: its release layout,\n"
    "           UE8M0 '.scale'); fp8-fp4 (V4), also the routed experts in FP4 E2M1 with a UE8M0 scale\n"
    "           per 1 x 32 block, as V4-Flash ships. Our import and transformers read both\n";

int64_t parse_count(std::string_view flag, std::string_view text) {
  const auto v = parse_number<int64_t>(flag, text);
  if (v < 0) throw UsageError{fmt::format("{} expects a non-negative integer, got '{}'", flag, text)};
  return v;
}

int convert_from_hf(const fs::path& hf_dir, const fs::path& root, int64_t step) {
  const train::HfImported imported = train::import_hf_folder(hf_dir, root, step);
  if (!imported.note.empty()) std::printf("%s\n", imported.note.c_str());
  std::printf("wrote %s (%zu tensors, MTP layers: %lld)\n", imported.folder.c_str(), imported.tensors,
              static_cast<long long>(imported.mtp_layers));
  return 0;
}

int convert_to_hf(const fs::path& ckpt, const fs::path& hf_dir, const std::string& flavor, const HfWriteOptions& options) {
  const fs::path folder = resolve_step_folder(ckpt);
  const size_t written = train::export_hf_folder(folder, hf_dir, flavor, options);
  std::printf("wrote %s (%zu tensors from %s)\n", hf_dir.c_str(), written, folder.c_str());
  return 0;
}

int convert_main(const std::vector<std::string_view>& args) {
  std::string from_hf, to, from, to_hf_dir, flavor;
  int64_t step = 0;
  HfWriteOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw UsageError{fmt::format("{} needs a value", arg)};
      return std::string(args[++i]);
    };
    if (arg == "--from-hf") {
      from_hf = value();
    } else if (arg == "--to") {
      to = value();
    } else if (arg == "--from") {
      from = value();
    } else if (arg == "--to-hf") {
      to_hf_dir = value();
    } else if (arg == "--flavor") {
      flavor = value();
    } else if (arg == "--step") {
      step = parse_count(arg, value());
    } else if (arg == "--max-shard-bytes") {
      options.max_shard_bytes = parse_count(arg, value());
    } else if (arg == "--dtype") {
      const std::string d = value();
      if (d != "bf16" && d != "f16" && d != "f32") throw UsageError{"--dtype must be bf16, f16 or f32, got '" + d + "'"};
      options.dtype = dtype_from_name(d);
    } else if (arg == "--quantize") {
      const std::string q = value();
      if (q != "fp8" && q != "fp8-fp4") throw UsageError{"--quantize must be fp8 or fp8-fp4, got '" + q + "'"};
      options.quantize = q == "fp8" ? HfQuantization::fp8 : HfQuantization::fp8_fp4;
    } else {
      throw UsageError{fmt::format("unknown option '{}'", arg)};
    }
  }
  if (!from_hf.empty() && !to.empty() && from.empty() && to_hf_dir.empty()) return convert_from_hf(from_hf, to, step);
  if (!from.empty() && !to_hf_dir.empty() && from_hf.empty() && to.empty()) return convert_to_hf(from, to_hf_dir, flavor, options);
  throw UsageError{"convert needs either --from-hf and --to, or --from and --to-hf"};
}

}  // namespace

int ckpt_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("ckpt", kUsage, [&] {
    if (args.empty()) throw UsageError{"missing subcommand"};
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args[0] != "convert") throw UsageError{fmt::format("unknown subcommand '{}'", args[0])};
    return convert_main({args.begin() + 1, args.end()});
  });
}

}  // namespace titan::cli
