// The model registry: one line per family (models/family.h), and the checks every family's
// build shares (an option the family has no use for is refused, naming the key). Lookups by
// name over the list: family_lookup.cpp.
#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/models/converters.h"
#include "titan/models/quantize.h"
#include "titan/models/deepseek_v3/family.h"
#include "titan/models/deepseek_v4/family.h"
#include "titan/models/family.h"
#include "titan/models/llama3/family.h"

namespace titan::models {

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> all = {
      &llama3::family(),
      &deepseek_v3::v3_family(),
      &deepseek_v3::v32_family(),
      &deepseek_v4::family(),
  };
  return all;
}

namespace {

std::string names_with(bool ModelFamily::*trait) {
  std::string names;
  for (const ModelFamily* f : model_families())
    if (f->*trait) names += (names.empty() ? "" : " / ") + f->name;
  return names;
}

// The options a family has no use for are refused, each naming its key.
void check_options(const ModelFamily& f, const ModelOptions& options) {
  const std::string& name = f.name;
  TITAN_CHECK(options.mtp_layers == 0 || f.multi_token_prediction,
              "model.mtp_layers = " + std::to_string(options.mtp_layers) + ": model '" + name + "' has no multi-token prediction",
              "set model.mtp_layers = 0 (models with MTP modules: " + names_with(&ModelFamily::multi_token_prediction) + ")");
  TITAN_CHECK(!options.ep || options.ep->size() == 1 || f.routed_experts,
              "parallelism.expert_parallel_degree = " + std::to_string(options.ep ? options.ep->size() : 1) + ": " + name +
                  " has no experts to divide",
              "set expert_parallel_degree = 1 (expert parallelism splits the routed experts of " +
                  names_with(&ModelFamily::routed_experts) + ")");
  converters_from_names(options.converters, name, f.converters);  // throws for a converter f lacks
  TITAN_CHECK(f.sparse_attention || options.dsa == DsaSchedule{},
              "the [dsa] section is set, but model " + name + " has no DeepSeek Sparse Attention",
              "remove the [dsa] keys, or train model.name = \"" + names_with(&ModelFamily::sparse_attention) + "\"");
  TITAN_CHECK(!options.hf_config || f.hf, "a Hugging Face architecture was given for model '" + name + "'",
              "only models with a Hugging Face conversion load one: set [model] name to a model `titan ckpt convert "
              "--from-hf` wrote");
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> export_tensors(const HfExport& job,
                                                           const std::vector<std::pair<std::string, Shape>>& shapes) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, shape] : shapes) {
    const auto it = job.tensors.find(name);
    TITAN_CHECK(it != job.tensors.end() && it->second.shape() == shape,
                "checkpoint " + job.source + ": model tensor '" + name + "' is " +
                    (it == job.tensors.end() ? std::string("missing") : it->second.shape().str()) +
                    ", the architecture needs " + shape.str(),
                "pass the --flavor the checkpoint was trained with");
    out.emplace_back(name, it->second);
  }
  return out;
}

std::unique_ptr<CausalLM> build_model(const std::string& name, const std::string& flavor, int64_t vocab_size,
                                      int64_t max_seq_len, const ModelOptions& options) {
  const ModelFamily& f = model_family(name);
  check_options(f, options);
  std::unique_ptr<CausalLM> model = f.build(flavor, vocab_size, max_seq_len, options);
  apply_converters(*model, converters_from_names(options.converters, name, f.converters));
  apply_quantize(*model, options.quantize);
  return model;
}

int64_t model_layers(const std::string& name, const std::string& flavor, int64_t vocab_size, const ModelOptions& options) {
  return model_family(name).n_layers(flavor, vocab_size, options);
}

}  // namespace titan::models
