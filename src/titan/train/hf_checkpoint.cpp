#include "titan/train/hf_checkpoint.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "titan/checkpoint/checkpoint.h"
#include "titan/core/error.h"
#include "titan/models/family.h"

namespace titan::train {

using namespace checkpoint;
namespace fs = std::filesystem;

namespace {

// The families that convert Hugging Face folders, each once (two names may share a conversion).
std::vector<const models::HfConversion*> conversions() {
  std::vector<const models::HfConversion*> out;
  for (const models::ModelFamily* f : models::model_families())
    if (f->hf && std::find(out.begin(), out.end(), f->hf) == out.end()) out.push_back(f->hf);
  return out;
}

}  // namespace

HfImported import_hf_folder(const fs::path& hf_dir, const fs::path& root, int64_t step) {
  const HfFolder folder = HfFolder::open(hf_dir);
  const models::HfConversion* conversion = nullptr;
  for (const models::HfConversion* c : conversions())
    if (c->reads(folder.config())) conversion = c;
  TITAN_CHECK(conversion != nullptr,
              (hf_dir / "config.json").string() + ": model_type '" + folder.config().value("model_type", std::string("?")) +
                  "' is not an architecture any model of this build converts",
              "convert a DeepSeek-V3 or V3.2 folder");
  const models::HfImport imported = conversion->import_folder(folder);
  SaveRequest req;
  req.step = step;
  for (const auto& [name, t] : imported.state) req.tensors.push_back({"model." + name, t, {}});
  // The HF config travels with the weights, so --to-hf can restore the exact architecture.
  req.train_state = {{"converted_from", hf_dir.string()}, {"hf_config", imported.hf_config}};
  req.config_toml = fmt::format("[model]\nname = \"{}\"\n", imported.model);
  return {save_checkpoint(root, req), imported.model, req.tensors.size(), imported.mtp_layers, imported.note};
}

size_t export_hf_folder(const fs::path& folder, const fs::path& hf_dir, const std::string& flavor,
                        const HfWriteOptions& options) {
  const LoadedCheckpoint ck = load_checkpoint(folder, [](const std::string& name) { return name.starts_with("model."); });
  models::HfExport job;
  for (const auto& [name, t] : ck.tensors)
    if (name.rfind("model.", 0) == 0) job.tensors[name.substr(6)] = t;
  TITAN_CHECK(!job.tensors.empty(), folder.string() + " holds no model tensors (\"model.*\")",
              "pass a training checkpoint written by titan train or titan ckpt convert");
  // The model, flavor and MTP depth it was trained with (its config.toml); --flavor wins.
  job.flavor = flavor;
  try {
    const toml::table t = toml::parse(ck.config_toml);
    job.model = t["model"]["name"].value_or(std::string());
    job.mtp_layers = t["model"]["mtp_layers"].value_or(int64_t(0));
    if (job.flavor.empty()) job.flavor = t["model"]["flavor"].value_or(std::string());
  } catch (const toml::parse_error& e) {
    TITAN_FAIL((folder / "config.toml").string() + " does not parse: " + std::string(e.description()),
               "pass --flavor to name the architecture");
  }
  if (ck.train_state.contains("hf_config")) job.hf_config = &ck.train_state["hf_config"];
  // The model's family converts it; a checkpoint whose config names no model, by the
  // architecture it was imported with.
  const models::HfConversion* conversion = nullptr;
  if (!job.model.empty()) {
    conversion = models::model_family(job.model).hf;
    std::string names;
    for (const models::ModelFamily* f : models::model_families())
      if (f->hf) names += (names.empty() ? "" : ", ") + f->name;
    TITAN_CHECK(conversion != nullptr, "the checkpoint holds model '" + job.model + "', which has no Hugging Face export",
                "export a model with a Hugging Face conversion (" + names + ")");
  } else if (job.hf_config) {
    for (const models::HfConversion* c : conversions())
      if (c->reads(*job.hf_config)) conversion = c;
  }
  TITAN_CHECK(conversion != nullptr, (folder / "config.toml").string() + " names no model ([model] name)",
              "pass a checkpoint written by titan train or titan ckpt convert");
  job.source = folder.string();
  job.options = options;
  return conversion->export_folder(job, hf_dir);
}

}  // namespace titan::train
