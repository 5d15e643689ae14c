// DeepSeek-V3's MoE layer as the model's MoeFactory: routed + shared SwiGLU experts from
// models/moe, sized and routed by the args. Defined with the family's spec (family.cpp), which
// gives it to every deepseek_v3 the trainer builds; tests and tools that load Hugging Face
// checkpoints with MoE layers pass it to load_hf_model.
#pragma once

#include <memory>

#include "titan/models/deepseek_v3/model.h"

namespace titan::models::deepseek_v3 {

std::unique_ptr<BlockFeedForward> moe_layer(const DeepSeekV3Args& a, int layer_id, const distributed::ProcessGroup* tp);
// The same with TorchTitan's scheme under TP (models/moe/moe.h, MoEArgs::tp_gather) instead of the MoE TP fix.
std::unique_ptr<BlockFeedForward> moe_layer_tp_gather(const DeepSeekV3Args& a, int layer_id,
                                                      const distributed::ProcessGroup* tp);

}  // namespace titan::models::deepseek_v3
