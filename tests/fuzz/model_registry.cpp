// The fuzz build's model registry. The parsers' library links no model code (see
// CMakeLists.txt), but config validation reads the registry: the families' names and the traits
// it checks (routed experts for expert_parallel_degree). This registry holds those for the
// families src/titan/models/families.cpp registers, and nothing that builds a model; a config
// the fuzzer feeds never reaches a build.
#include "titan/core/error.h"
#include "titan/models/family.h"

namespace titan::models {

namespace {
std::vector<std::string> no_flavors() { return {}; }
const ModelFamily kLlama3{.name = "llama3", .flavors = no_flavors};
const ModelFamily kDeepSeekV3{.name = "deepseek_v3", .flavors = no_flavors, .routed_experts = true,
                              .multi_token_prediction = true};
const ModelFamily kDeepSeekV32{.name = "deepseek_v32", .flavors = no_flavors, .routed_experts = true,
                               .sparse_attention = true};
}  // namespace

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> all = {&kLlama3, &kDeepSeekV3, &kDeepSeekV32};
  return all;
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families()) names.push_back(f->name);
  return names;
}

const std::string& default_model_name() { return model_families().front()->name; }

const ModelFamily& model_family(const std::string& name) {
  for (const ModelFamily* f : model_families())
    if (f->name == name) return *f;
  TITAN_FAIL("model '" + name + "' is not implemented in this build");
}

}  // namespace titan::models
