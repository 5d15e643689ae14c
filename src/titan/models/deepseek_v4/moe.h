// DeepSeek-V4's mixture of experts (../shared/reference/v4_transformers.md section 4,
// transformers' DeepseekV4SparseMoeBlock) on tokens h [T, d]:
//   s = score(gate h)                          [E]  sqrt(softplus) (or sigmoid), f32
//   idx = top-K of s + expert_bias             "moe" layers: the bias steers the choice only
//       = tid2eid[token id]                    "hash_moe" layers: a frozen table, repeats allowed
//   w = s[idx] / (sum s[idx] + 1e-20) * routed_scaling_factor     from the unbiased scores
//   out = sum_k w_k Expert_idx_k(h) + Shared(h)
// Every expert, the shared one too, is the clamped SwiGLU of width F:
//   W2 (silu(min(W1 h, limit)) * clamp(W3 h, -limit, limit)), the routing weight applied after W2.
// The gate is trained in hash layers too; no gradient reaches the choice.
//
// Parameters reuse the DeepSeek-V3 MoE's modules and layout (models/moe/moe.h), so plans and
// expert parallelism treat them alike: router.gate.weight [E, d] (f32, transformers' mlp.gate.weight),
// experts.w1 / w3 [E, F, d] (gate_up_proj's rows [0, F) / [F, 2F)), experts.w2 [E, d, F]
// (down_proj), shared_experts.w{1,3,2}.weight (gate_proj, up_proj, down_proj). Buffers (state):
// expert_bias [E] f32 (e_score_correction_bias) in "moe" layers, tid2eid [V, K] i64 in "hash_moe"
// layers. Initialization as transformers': every weight N(0, init_std), the bias and table zeros.
#pragma once

#include <cstdint>

#include "titan/kernels/activation.h"
#include "titan/kernels/moe_router_params.h"
#include "titan/models/moe/moe.h"
#include "titan/nn/module.h"

namespace titan::models::deepseek_v4 {

using autograd::Variable;

// How a layer chooses its experts: transformers' mlp_layer_types "moe" and "hash_moe".
enum class MoERouting : uint8_t { learned, hash };

struct MoEArgs {
  int64_t dim = 0;                    // hidden_size, d
  int64_t moe_intermediate_size = 0;  // F: every routed expert's width, and the shared expert's
  int64_t n_routed_experts = 0;       // E
  int64_t num_experts_per_tok = 1;    // K
  double routed_scaling_factor = 1.0;
  double swiglu_limit = 10.0;  // transformers' default; kernels::kNoSwigluLimit: no clamp
  kernels::RouterScore scoring_func = kernels::RouterScore::sqrtsoftplus;  // or sigmoid
  MoERouting routing = MoERouting::learned;
  int64_t vocab_size = 0;  // rows of tid2eid (hash routing)
  double init_std = 0.02;  // initializer_range
  kernels::RouterParams router_params() const;
  void validate() const;  // throws, naming the config key, on sizes that cannot work
};

// The name transformers gives a routing in mlp_layer_types.
const char* layer_type_name(MoERouting routing);

class MoE : public nn::Module {
 public:
  explicit MoE(const MoEArgs& a);

  // h [T, d] (f32 or bf16) -> [T, d], h's dtype. token_ids [T] i32: the input ids of these tokens,
  // required by hash routing (ignored by learned routing).
  Variable forward(const Variable& h, const Tensor& token_ids = Tensor()) const;

  const MoEArgs& args() const { return args_; }

  models::moe::TokenChoiceTopKRouter& router;  // gate [E, d], f32
  models::moe::GroupedExperts& experts;
  models::moe::FeedForward& shared_experts;
  Tensor expert_bias;  // [E] f32, learned routing only (undefined for hash routing)
  Tensor tid2eid;      // [V, K] i64, hash routing only (undefined for learned routing)

 private:
  // The experts [T, K] i32 of each token: tid2eid's rows at token_ids, checked.
  Tensor hash_choice(const Tensor& token_ids, int64_t tokens) const;
  MoEArgs args_;
};

}  // namespace titan::models::deepseek_v4
