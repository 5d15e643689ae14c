// Llama-3's parallel plan. Data parallel (TorchTitan's llama3 parallelize.py): one FSDP / DDP
// unit for the token embedding, one per transformer block, one for the output head; the final
// norm is in the root unit.
#include "titan/models/llama3/model.h"

namespace titan::models::llama3 {

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  TITAN_CHECK(output != nullptr, "llama3 with tied embeddings (tie_embeddings) cannot be sharded: the table is read "
                                 "both as the f32 embedding and as the bf16 output weight",
              "train the flavor untied, or on one rank");
  std::vector<nn::ShardingUnit> units = {{"tok_embeddings", &tok_embeddings, true}};
  for (size_t l = 0; l < layers.size(); ++l) units.push_back({"layers." + std::to_string(l), &layers[l], true});
  units.push_back({"output", output, false});
  return units;
}

}  // namespace titan::models::llama3
