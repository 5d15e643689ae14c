// How an MoE router turns its logits into a choice of experts (DeepSeek-V3 / TorchTitan
// TokenChoiceTopKRouter). Shared by the Tensor-level API, its reference twin and the MoE module.
#pragma once

#include <cstdint>

namespace titan::kernels {

// sqrtsoftplus: sqrt(softplus(logit)), DeepSeek-V4's score (transformers' "sqrtsoftplus"; softplus
// is the logit itself above 20, as torch's threshold has it).
enum class RouterScore : uint8_t { softmax, sigmoid, sqrtsoftplus };

struct RouterParams {
  int64_t experts = 0;  // E, routed experts
  int64_t top_k = 1;    // experts per token
  RouterScore score = RouterScore::softmax;
  // Group-limited routing: the E experts form n_groups equal groups; a group ranks by the sum of
  // its two best biased scores, and only the best topk_groups groups are eligible. 1 / 1: off.
  int64_t n_groups = 1, topk_groups = 1;
  bool route_norm = false;   // divide the selected weights by their sum (+ 1e-20)
  double route_scale = 1.0;  // then multiply them by this

  int64_t group_size() const { return experts / n_groups; }
};

}  // namespace titan::kernels
