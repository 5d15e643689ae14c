// What training tests start from: the TOML of a short f32 debug-model run, and the losses a run
// logged. Shared by the e2e and the distributed tests.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace titan::test {

namespace fs = std::filesystem;

// The [section] key = value lines of a debug-model run of `steps` steps on `data` into `run`.
inline std::string base_toml(const std::string& model, const fs::path& data, const fs::path& run, int steps) {
  std::string toml = "[job]\ndump_folder = \"" + run.string() + "\"\n[model]\nname = \"" + model +
                     "\"\nflavor = \"debugmodel\"\n[training]\nseq_len = 64\nsteps = " + std::to_string(steps) +
                     "\ndataset_path = \"" + data.string() +
                     "\"\nmixed_precision_param = \"float32\"\n[optimizer]\nlr = 3e-3\n[lr_scheduler]\nwarmup_steps = 4\n"
                     "decay_ratio = 0.5\ndecay_type = \"cosine\"\n[activation_checkpoint]\nmode = \"none\"\n"
                     "[metrics]\nlog_freq = 1\n[comm]\ninit_timeout_seconds = 300\ntimeout_seconds = 300\n";
  // DeepSeek-V3.2: the dense warm-up (indexers only) for 3 steps, then the sparse stage, each query
  // attending to 16 of its keys (a real selection past position 16).
  if (model == "deepseek_v32") toml += "[dsa]\nwarmup_steps = 3\ntopk = 16\n";
  // DeepSeek-V4: each CSA query attends to 4 of the 16 compressed entries of its sequence.
  if (model == "deepseek_v4") toml += "[dsa]\ntopk = 4\n";
  return toml;
}

// The per-step training losses of a run folder's metrics.jsonl (kind "validation": its
// validation losses; key: another logged value, e.g. "indexer_loss", of the steps that log it).
inline std::vector<double> losses_of(const fs::path& run, const std::string& kind = "train",
                                     const std::string& key = "loss") {
  std::vector<double> out;
  std::ifstream f(run / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == kind && j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

}  // namespace titan::test
