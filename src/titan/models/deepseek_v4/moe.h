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
// It is DeepSeek-V3's MoE module (models/moe/moe.h) configured by moe_args, so expert
// parallelism, the aux-loss-free bias update, the expert-load metrics and the small-op forms are
// that module's. State (transformers' names in hf_adapter.h): router.gate.weight [E, d] f32,
// experts.w1 / w3 [E, F, d], experts.w2 [E, d, F], shared_experts.w{1,3,2}.weight, and
// expert_bias [E] f32 in "moe" layers or tid2eid [V, K] i64 in "hash_moe" layers; the expert
// loads (tokens_per_expert, warmup_tokens_per_expert) are statistics, not state.
// Initialization as transformers': every weight N(0, init_std), the bias and table zeros.
#pragma once

#include <cstdint>

#include "titan/models/deepseek_v4/args.h"
#include "titan/models/moe/moe.h"

namespace titan::distributed {
class ProcessGroup;
}

namespace titan::models::deepseek_v4 {

using MoE = models::moe::MoE;

// The MoE of layer `layer` of `a`: one shared expert of width F, always-renormalised weights,
// hash routing in its hash_moe layers; the parallel groups (ep, tp, tp_gather) those of `groups`.
models::moe::MoEArgs moe_args(const DeepSeekV4Args& a, int64_t layer, const models::moe::MoEArgs& groups = {});

}  // namespace titan::models::deepseek_v4
