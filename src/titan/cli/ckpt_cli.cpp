#include "titan/cli/ckpt_cli.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "titan/checkpoint/checkpoint.h"
#include "titan/checkpoint/hf.h"
#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/models/deepseek_v3/hf_adapter.h"

namespace titan::cli {

using namespace checkpoint;
namespace fs = std::filesystem;
using json = nlohmann::json;
namespace ds = models::deepseek_v3;

namespace {

constexpr const char* kUsage =
    "usage: titan ckpt convert --from-hf HF_DIR --to CKPT_ROOT [--step N]\n"
    "       titan ckpt convert --from CKPT --to-hf HF_DIR [--flavor NAME] [--dtype bf16|f16|f32]\n"
    "                          [--max-shard-bytes N]\n"
    "\n"
    "--from-hf  reads a Hugging Face DeepSeek-V3 or V3.2 folder (config.json, model.safetensors or\n"
    "           a sharded index; FP8 block-quantized weights are dequantized) and writes CKPT_ROOT/step-N/;\n"
    "           its MTP layers come along when the folder has their weights (DeepSeek's has; one that\n"
    "           transformers' save_pretrained wrote has none: train with --model.mtp_layers to start\n"
    "           MTP fresh)\n"
    "--to-hf    writes a training checkpoint (a step folder, or a root holding step folders) as a\n"
    "           Hugging Face folder: config.json, shards of at most --max-shard-bytes (5 GiB) and\n"
    "           model.safetensors.index.json. The architecture comes from the checkpoint when it was\n"
    "           converted from HF, else from --flavor (or the [model] flavor of its config.toml)\n";

int64_t parse_count(std::string_view flag, std::string_view text) {
  const auto v = parse_number<int64_t>(flag, text);
  if (v < 0) throw UsageError{fmt::format("{} expects a non-negative integer, got '{}'", flag, text)};
  return v;
}

int convert_from_hf(const fs::path& hf_dir, const fs::path& root, int64_t step) {
  const HfFolder folder = HfFolder::open(hf_dir);
  // The MTP layers the folder has weights for: transformers' save_pretrained writes none though
  // its config.json says num_nextn_predict_layers 1; the note says so (and what training does).
  std::string note;
  const ds::DeepSeekV3Args a = ds::args_from_hf_folder(folder, &note);
  if (!note.empty()) std::printf("%s\n", note.c_str());
  const std::map<std::string, Tensor> state = ds::load_hf_state(folder, a, ds::state_shapes(a));
  SaveRequest req;
  req.step = step;
  for (const auto& [name, shape] : ds::state_shapes(a)) req.tensors.push_back({"model." + name, state.at(name), {}});
  // The HF config travels with the weights, so --to-hf can restore the exact architecture.
  req.train_state = {{"converted_from", hf_dir.string()}, {"hf_config", folder.config()}};
  // The registry's name: DeepSeek-V3.2 (an indexer in every layer) is its own model.
  req.config_toml = fmt::format("[model]\nname = \"{}\"\n", a.has_indexer() ? "deepseek_v32" : "deepseek_v3");
  const fs::path out = save_checkpoint(root, req);
  std::printf("wrote %s (%zu tensors, MTP layers: %lld)\n", out.c_str(), req.tensors.size(),
              static_cast<long long>(a.num_mtp_layers));
  return 0;
}

int convert_to_hf(const fs::path& ckpt, const fs::path& hf_dir, const std::string& flavor, const HfWriteOptions& options) {
  const fs::path folder = resolve_step_folder(ckpt);
  const LoadedCheckpoint ck = load_checkpoint(folder, [](const std::string& name) { return name.starts_with("model."); });
  std::map<std::string, Tensor> model_tensors;
  for (const auto& [name, t] : ck.tensors)
    if (name.rfind("model.", 0) == 0) model_tensors[name.substr(6)] = t;
  TITAN_CHECK(!model_tensors.empty(), folder.string() + " holds no model tensors (\"model.*\")",
              "pass a training checkpoint written by titan train or titan ckpt convert");
  ds::DeepSeekV3Args a;
  if (ck.train_state.contains("hf_config")) {
    a = ds::args_from_hf_config(ck.train_state["hf_config"], (folder / "train_state.json").string());
    // A run continued from it may have trained fewer MTP modules than the original had (mtp_layers).
    int64_t mtp = 0;
    while (model_tensors.count("mtp." + std::to_string(mtp) + ".eh_proj.weight")) ++mtp;
    a.num_mtp_layers = mtp;
    a.n_dense_layers = std::min(a.n_dense_layers, a.n_layers + mtp);
  } else {
    std::string name = "deepseek_v3", from_config = flavor;
    int64_t mtp_layers = 0;
    try {
      const toml::table t = toml::parse(ck.config_toml);
      name = t["model"]["name"].value_or(name);
      mtp_layers = t["model"]["mtp_layers"].value_or(int64_t(0));
      if (from_config.empty()) from_config = t["model"]["flavor"].value_or(std::string());
    } catch (const toml::parse_error& e) {
      TITAN_FAIL((folder / "config.toml").string() + " does not parse: " + std::string(e.description()),
                 "pass --flavor to name the architecture");
    }
    const bool v32 = name == "deepseek_v32";
    TITAN_CHECK(name == "deepseek_v3" || v32,
                "HF export supports models deepseek_v3 and deepseek_v32, the checkpoint holds '" + name + "'",
                "export other models with their own adapter");
    std::string flavors;
    for (const std::string& f : v32 ? ds::deepseek_v32_flavor_names() : ds::deepseek_v3_flavor_names())
      flavors += (flavors.empty() ? "" : ", ") + f;
    TITAN_CHECK(!from_config.empty(), "cannot tell the architecture of " + folder.string(),
                "pass --flavor (" + name + ": " + flavors + ")");
    const auto embedding = model_tensors.find("tok_embeddings.weight");
    const int64_t vocab = embedding == model_tensors.end() ? 0 : embedding->second.size(0);
    a = v32 ? ds::deepseek_v32_flavor(from_config, vocab) : ds::deepseek_v3_flavor(from_config, vocab);
    a.num_mtp_layers = mtp_layers;  // trained with [model] mtp_layers: its MTP modules export too
    // A model trained without the MoE layer is all-dense (see deepseek_v3/model.h).
    bool has_moe = false;
    for (const auto& [n, t] : model_tensors) has_moe |= n.find(".moe.") != std::string::npos;
    if (!has_moe) a.n_dense_layers = a.n_layers + a.num_mtp_layers;
  }
  // Exactly the architecture's weights, in its order; run-time buffers (e.g. MoE token counts)
  // have no place in an HF folder.
  std::vector<std::pair<std::string, Tensor>> state;
  for (const auto& [name, shape] : ds::state_shapes(a)) {
    const auto it = model_tensors.find(name);
    TITAN_CHECK(it != model_tensors.end() && it->second.shape() == shape,
                "checkpoint " + folder.string() + ": model tensor '" + name + "' is " +
                    (it == model_tensors.end() ? std::string("missing") : it->second.shape().str()) + ", the architecture needs " +
                    shape.str(),
                "pass the --flavor the checkpoint was trained with");
    state.emplace_back(name, it->second);
  }
  ds::save_hf(hf_dir, a, state, options);
  std::printf("wrote %s (%zu tensors from %s)\n", hf_dir.c_str(), state.size(), folder.c_str());
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
