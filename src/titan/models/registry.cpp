#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/llama3/model.h"

namespace titan::models {

std::unique_ptr<CausalLM> build_model(const std::string& name, const std::string& flavor, int64_t vocab_size,
                                      int64_t max_seq_len) {
  if (name == "llama3") {
    llama3::Llama3Args a = llama3::llama3_flavor(flavor, vocab_size);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
    return std::make_unique<llama3::Transformer>(a);
  }
  if (name == "deepseek_v3") {
    deepseek_v3::DeepSeekV3Args a = deepseek_v3::deepseek_v3_flavor(flavor, vocab_size);
    a.max_seq_len = std::max(a.max_seq_len, max_seq_len);
    // No MoE factory yet: the MoE layers are dense SwiGLU stand-ins (see deepseek_v3/model.h).
    return std::make_unique<deepseek_v3::Transformer>(a);
  }
  std::string names;
  for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
  TITAN_FAIL("model '" + name + "' is not implemented in this build", "set [model] name to one of: " + names);
}

std::vector<std::string> model_names() { return {"llama3", "deepseek_v3"}; }

}  // namespace titan::models
