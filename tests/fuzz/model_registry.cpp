// The fuzz build's list of model families (the lookups over it are models/family_lookup.cpp's).
// The parsers' library links no model code (see CMakeLists.txt), but config validation reads the
// families' names and the traits it checks (routed experts for expert_parallel_degree). This list
// holds those for the families src/titan/models/families.cpp registers, and nothing that builds a
// model; a config the fuzzer feeds never reaches a build.
#include "titan/models/family.h"

namespace titan::models {

namespace {
std::vector<std::string> no_flavors() { return {}; }
const ModelFamily kLlama3{.name = "llama3", .flavors = no_flavors, .fp16 = true};
const ModelFamily kDeepSeekV3{.name = "deepseek_v3", .flavors = no_flavors, .routed_experts = true,
                              .multi_token_prediction = true};
const ModelFamily kDeepSeekV32{.name = "deepseek_v32", .flavors = no_flavors, .routed_experts = true,
                               .sparse_attention = true};
const ModelFamily kDeepSeekV4{.name = "deepseek_v4", .flavors = no_flavors, .routed_experts = true,
                              .sparse_attention = true};
}  // namespace

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> all = {&kLlama3, &kDeepSeekV3, &kDeepSeekV32, &kDeepSeekV4};
  return all;
}

}  // namespace titan::models
