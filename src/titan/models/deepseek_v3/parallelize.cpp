// DeepSeek-V3 / V3.2's parallel plan. Data parallel (TorchTitan's deepseek_v3 parallelize.py,
// without expert parallelism): one FSDP / DDP unit for the token embedding, one per transformer
// block (its MoE experts included), one per MTP module (which also reuses the embedding and the
// head), one for the output head, in the order the forward first runs them; the final norm is in
// the root unit.
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v3/mtp.h"

namespace titan::models::deepseek_v3 {

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  std::vector<nn::ShardingUnit> units = {{"tok_embeddings", &tok_embeddings, true}};
  for (size_t l = 0; l < layers.size(); ++l) units.push_back({"layers." + std::to_string(l), &layers[l], true});
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) units.push_back({"mtp." + std::to_string(k), &(*mtp)[k], true});
  units.push_back({"output", &output, false});
  return units;
}

}  // namespace titan::models::deepseek_v3
