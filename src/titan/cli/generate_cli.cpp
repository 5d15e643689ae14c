#include "titan/cli/generate_cli.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpoint.h"
#include "titan/cli/args.h"
#include "titan/core/error.h"
#include "titan/data/tokenizer.h"
#include "titan/models/causal_lm.h"
#include "titan/train/config.h"
#include "titan/train/generate.h"

namespace titan::cli {

namespace fs = std::filesystem;
using namespace train;

namespace {

constexpr const char* kUsage =
    "usage: titan generate --checkpoint DIR --prompt TEXT [--max-new-tokens 100] [--temperature 0.8]\n"
    "                      [--top-k 50] [--top-p 0.95] [--seed 0] [--tokenizer tokenizer.json]\n"
    "DIR is a checkpoint step folder (e.g. outputs/llama3_debug/checkpoint/step-300) or the\n"
    "checkpoint folder itself (its newest step is used).\n";

struct GenerateArgs {
  std::string checkpoint, prompt, tokenizer;
  int64_t max_new = 100;
  uint64_t seed = 0;
  SamplingOptions sampling;
};

GenerateArgs parse_args(const std::vector<std::string_view>& args) {
  GenerateArgs g;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= args.size()) throw UsageError{std::string(a) + " needs a value"};
      return args[++i];
    };
    if (a == "--checkpoint") g.checkpoint = value();
    else if (a == "--prompt") g.prompt = value();
    else if (a == "--tokenizer") g.tokenizer = value();
    else if (a == "--max-new-tokens") g.max_new = parse_number<int64_t>(a, value());
    else if (a == "--temperature") g.sampling.temperature = parse_number<double>(a, value());
    else if (a == "--top-k") g.sampling.top_k = parse_number<int64_t>(a, value());
    else if (a == "--top-p") g.sampling.top_p = parse_number<double>(a, value());
    else if (a == "--seed") g.seed = parse_number<uint64_t>(a, value());
    else throw UsageError{"unknown option '" + std::string(a) + "'"};
  }
  if (g.checkpoint.empty()) throw UsageError{"--checkpoint DIR is required"};
  return g;
}

// The model of a checkpoint step folder, built and filled for f32 decoding. The optimizer state
// (twice the model's size) is neither read nor checked, nor are the MTP modules (training only).
std::unique_ptr<models::CausalLM> load_model(const fs::path& folder, const data::Tokenizer& tok, const JobConfig& cfg,
                                             const nlohmann::json& train_state) {
  const auto wanted = [](const std::string& name) { return name.starts_with("model.") && !name.starts_with("model.mtp."); };
  const checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(folder, wanted);
  // A checkpoint converted from Hugging Face (or trained from one) records the architecture.
  const nlohmann::json* hf_config = train_state.contains("hf_config") ? &train_state["hf_config"] : nullptr;
  models::ModelOptions options;
  options.hf_config = hf_config;
  auto model = models::build_model(cfg.model.name, cfg.model.flavor, tok.vocab_size(), cfg.training.seq_len, options);
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : ck.tensors) state[name.substr(6)] = t;
  // Routing statistics (MoE token counts): run-time, not in a converted checkpoint.
  for (const nn::BufferKind kind : {nn::BufferKind::step_statistic, nn::BufferKind::saved_statistic})
    for (const auto& [name, t] : model->named_buffers(kind)) state.try_emplace(name, t);
  model->load_state_dict(state, true, folder.string());
  model->set_compute_dtype(DType::f32);
  return model;
}

// Prints the prompt, then each sampled token's text as it completes, until EOS or the length.
void sample(models::CausalLM& model, const data::Tokenizer& tok, const GenerateArgs& g) {
  std::vector<int32_t> ids = tok.encode(g.prompt, /*add_bos=*/tok.bos_id().has_value());
  TITAN_CHECK(!ids.empty(), "the prompt encodes to no tokens", "pass a non-empty --prompt");
  const int64_t max_len = std::min<int64_t>(model.max_seq_len(), int64_t(ids.size()) + g.max_new);
  model.start_generation(1, max_len);
  Generator rng(g.seed, "generate");
  Tensor input = Tensor::empty({1, int64_t(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), input.data<int32_t>());
  std::printf("%s", g.prompt.c_str());
  std::vector<int32_t> generated;
  std::string printed;
  for (int64_t n = 0; n < g.max_new && int64_t(ids.size() + generated.size()) < max_len; ++n) {
    const Tensor logits = model.decode(input);
    const int32_t next = sample_token(std::span<const float>(logits.data<float>(), size_t(logits.numel())), g.sampling, rng);
    if (tok.eos_id() && next == *tok.eos_id()) break;
    generated.push_back(next);
    // Print the text decoded so far minus what is already out (a token may end mid-character).
    const std::string text = tok.decode(generated, /*skip_special=*/true);
    if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0) {
      std::fputs(text.c_str() + printed.size(), stdout);
      std::fflush(stdout);
      printed = text;
    }
    input = Tensor::full({1, 1}, double(next), DType::i32);
  }
  std::printf("\n");
}

int generate(const GenerateArgs& g) {
  const fs::path folder = checkpoint::resolve_step_folder(g.checkpoint);
  const JobConfig cfg = parse_config(checkpoint::load_config_toml(folder), (folder / "config.toml").string());
  const std::string tokenizer_path = g.tokenizer.empty() ? cfg.model.tokenizer_path : g.tokenizer;
  TITAN_CHECK(!tokenizer_path.empty(), "the checkpoint's config names no tokenizer (model.tokenizer_path)",
              "pass --tokenizer tokenizer.json");
  const data::Tokenizer tok = data::Tokenizer::load(tokenizer_path);
  const auto model = load_model(folder, tok, cfg, checkpoint::load_train_state(folder));
  sample(*model, tok, g);
  return 0;
}

}  // namespace

int generate_main(int argc, char** argv) {
  const std::vector<std::string_view> args = arguments(argc, argv, 1);
  return run_command("generate", kUsage, [&] {
    if (wants_help(args)) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return generate(parse_args(args));
  });
}

}  // namespace titan::cli
