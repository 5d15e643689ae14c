// DeepSeek-V4's state dict <-> transformers' DeepseekV4ForCausalLM.state_dict() names
// (../shared/reference/v4_transformers.md 6.1). Ours is transformers' without the "model."
// prefix, except where our layers keep another layout:
//   model.hc_head.hc_{fn,base,scale}            hc_head.{fn,base,scale}
//   model.layers.L.mlp.gate.weight              layers.L.mlp.router.gate.weight
//   model.layers.L.mlp.gate.e_score_correction_bias / .tid2eid    layers.L.mlp.expert_bias / .tid2eid
//   model.layers.L.mlp.experts.gate_up_proj [E, 2F, d]   layers.L.mlp.experts.w1 (rows [0, F)), .w3 (rows [F, 2F))
//   model.layers.L.mlp.experts.down_proj [E, d, F]       layers.L.mlp.experts.w2
//   model.layers.L.mlp.shared_experts.{gate,up,down}_proj.weight   layers.L.mlp.shared_experts.{w1,w3,w2}.weight
// An MTP module (mtp.h; transformers has none and ignores "mtp.*" on load) is written as a layer
// under "model.mtp.K." with its own e_proj, h_proj, enorm, hnorm, norm and hc_head.hc_{fn,base,scale};
// the release's "mtp.K.*" (DeepSeek's naming: attn.*, ffn.*, hc_attn_*, hc_head_fn, ...) is read too.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::models::deepseek_v4 {

// DeepSeek's own naming (the release, without "model."; and what transformers' save_pretrained
// writes back, with it: attn.wq_a, ffn.experts.E.w1, hc_attn_fn, head.weight, ...) is read too,
// per-expert matrices stacked over E.

// Our tensors from transformers' (every name must be one of the model's; `source` names the
// folder or file in errors). The hash tables keep transformers' integer values as i64.
std::map<std::string, Tensor> state_from_hf(const std::map<std::string, Tensor>& hf, const std::string& source);
// transformers' names and layouts from ours.
std::map<std::string, Tensor> state_to_hf(const std::map<std::string, Tensor>& ours);
// The V4 release's layout from ours (spec 6.2, 6.4): DeepSeek's names without "model.", one matrix
// per expert; the attention's and shared experts' matrices FP8 E4M3 with UE8M0 scales per
// 128 x 128 block under "<X>.scale"; the routed experts FP4 with UE8M0 scales per 1 x 32 block
// (fp4_experts; else FP8 like the rest); the embedding, head, router and compressor / indexer
// projections bf16; the rest f32 (the hash tables i64).
std::vector<std::pair<std::string, Tensor>> state_to_release(const std::map<std::string, Tensor>& ours, bool fp4_experts);

}  // namespace titan::models::deepseek_v4
