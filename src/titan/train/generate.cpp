#include "titan/train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "titan/checkpoint/checkpoint.h"
#include "titan/data/tokenizer.h"
#include "titan/models/causal_lm.h"
#include "titan/train/config.h"

namespace titan::train {

namespace fs = std::filesystem;

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, Generator& rng) {
  const int64_t v = int64_t(logits.size());
  TITAN_CHECK(v > 0, "sample_token: empty logits");
  if (o.temperature <= 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates sorted by logit (ties: lower id first), cut to top-k.
  std::vector<int32_t> ids(static_cast<size_t>(v));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, v) : v;
  auto by_logit = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
  ids.resize(size_t(k));
  std::vector<double> p(ids.size());
  const double mx = logits[size_t(ids[0])];
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += p[i] = std::exp((logits[size_t(ids[i])] - mx) / o.temperature);
  // Nucleus: the smallest prefix whose probability reaches top_p.
  size_t keep = ids.size();
  if (o.top_p < 1) {
    double acc = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      acc += p[i] / sum;
      if (acc >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[i];
  const double u = double(rng.next_uniform()) * kept;
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u < acc) return ids[i];
  }
  return ids[keep - 1];
}

int generate_main(int argc, char** argv) {
  std::string ckpt, prompt, tokenizer_path;
  int64_t max_new = 100;
  uint64_t seed = 0;
  SamplingOptions so;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      TITAN_CHECK(i + 1 < argc, a + " needs a value", "see titan generate --help");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf("usage: titan generate --checkpoint DIR --prompt TEXT [--max-new-tokens 100] [--temperature 0.8]\n"
                  "                      [--top-k 50] [--top-p 0.95] [--seed 0] [--tokenizer tokenizer.json]\n"
                  "DIR is a checkpoint step folder (e.g. outputs/llama3_debug/checkpoint/step-300) or the\n"
                  "checkpoint folder itself (its newest step is used).\n");
      return 0;
    }
    if (a == "--checkpoint") ckpt = value();
    else if (a == "--prompt") prompt = value();
    else if (a == "--tokenizer") tokenizer_path = value();
    else if (a == "--max-new-tokens") max_new = std::stoll(value());
    else if (a == "--temperature") so.temperature = std::stod(value());
    else if (a == "--top-k") so.top_k = std::stoll(value());
    else if (a == "--top-p") so.top_p = std::stod(value());
    else if (a == "--seed") seed = std::stoull(value());
    else TITAN_FAIL("titan generate: unknown option " + a, "see titan generate --help");
  }
  TITAN_CHECK(!ckpt.empty(), "titan generate needs --checkpoint DIR", "see titan generate --help");
  fs::path folder = ckpt;
  if (!fs::exists(folder / "metadata.json")) {
    const auto latest = checkpoint::latest_checkpoint(folder);
    TITAN_CHECK(latest.has_value(), ckpt + " is neither a checkpoint step folder nor holds one",
                "pass e.g. outputs/<run>/checkpoint/step-N");
    folder = *latest;
  }
  const checkpoint::LoadedCheckpoint ck = checkpoint::load_checkpoint(folder);
  const JobConfig cfg = parse_config(ck.config_toml, (folder / "config.toml").string());
  if (tokenizer_path.empty()) tokenizer_path = cfg.model.tokenizer_path;
  TITAN_CHECK(!tokenizer_path.empty(), "the checkpoint's config names no tokenizer (model.tokenizer_path)",
              "pass --tokenizer tokenizer.json");
  const data::Tokenizer tok = data::Tokenizer::load(tokenizer_path);
  // A checkpoint converted from Hugging Face (or trained from one) records the architecture. The
  // MTP modules (training only) are neither built nor loaded.
  const nlohmann::json* hf_config = ck.train_state.contains("hf_config") ? &ck.train_state["hf_config"] : nullptr;
  auto model = models::build_model(cfg.model.name, cfg.model.flavor, tok.vocab_size(), cfg.training.seq_len,
                                   {0, cfg.model.mtp_loss_weight, hf_config});
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : ck.tensors)
    if (name.rfind("model.", 0) == 0 && name.rfind("model.mtp.", 0) != 0) state[name.substr(6)] = t;
  for (const auto& [name, t] : model->state_dict())  // MoE token counts: run-time, not in a converted checkpoint
    if (name.ends_with("tokens_per_expert")) state.try_emplace(name, t);
  model->load_state_dict(state, true, folder.string());
  model->set_compute_dtype(DType::f32);

  std::vector<int32_t> ids = tok.encode(prompt, /*add_bos=*/tok.bos_id().has_value());
  TITAN_CHECK(!ids.empty(), "the prompt encodes to no tokens", "pass a non-empty --prompt");
  const int64_t max_len = std::min<int64_t>(model->max_seq_len(), int64_t(ids.size()) + max_new);
  model->start_generation(1, max_len);
  Generator rng(seed, "generate");
  Tensor input = Tensor::empty({1, int64_t(ids.size())}, DType::i32);
  std::copy(ids.begin(), ids.end(), input.data<int32_t>());
  std::printf("%s", prompt.c_str());
  std::vector<int32_t> generated;
  std::string printed;
  for (int64_t n = 0; n < max_new && int64_t(ids.size() + generated.size()) < max_len; ++n) {
    const Tensor logits = model->decode(input);
    const int32_t next = sample_token(std::span<const float>(logits.data<float>(), size_t(logits.numel())), so, rng);
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
  return 0;
}

}  // namespace titan::train
