// Llama-3's parallel plan (TorchTitan's llama3 parallelize.py).
//
// Data parallel: one FSDP / DDP unit for the token embedding, one per transformer block, one for
// the output head; the final norm is in the root unit.
//
// Tensor + sequence parallel: wq, wk, wv, w1, w3 column-parallel (this rank's heads, FFN
// columns), wo and w2 row-parallel, their sums reduce-scattered to sequence pieces; the norms
// sequence-parallel (replicated weights whose gradients are summed over TP); the embedding
// vocabulary-parallel and the output head column-parallel over the vocabulary, its logits
// consumed by loss parallel (distributed/tensor_parallel.h).
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/llama3/model.h"

namespace titan::models::llama3 {

void check_tensor_parallel(const Llama3Args& a, int64_t degree) {
  distributed::check_tensor_parallel_degree(
      degree, "llama3",
      {{"attention heads", a.n_heads}, {"KV heads", a.kv_heads()}, {"FFN hidden units", a.ffn_hidden()},
       {"vocabulary entries", a.vocab_size}},
      " (a vocabulary: prepare the data with a tokenizer whose size the degree divides)");
}

void Transformer::place_tensor_parallel() {
  const distributed::ProcessGroup* tp = tp_;  // null: declare the plan only
  using distributed::replicate_parameter;
  using distributed::shard_parameter;
  if (tok_embeddings) shard_parameter(tok_embeddings->weight, 0, tp);  // vocabulary rows
  for (size_t l = 0; l < layers.size(); ++l) {
    TransformerBlock& b = layers[l];
    for (nn::Linear* colwise : {&b.attention.wq, &b.attention.wk, &b.attention.wv, &b.feed_forward.w1, &b.feed_forward.w3})
      shard_parameter(colwise->weight, 0, tp);
    for (nn::Linear* rowwise : {&b.attention.wo, &b.feed_forward.w2}) shard_parameter(rowwise->weight, 1, tp);
    replicate_parameter(b.attention_norm.weight, tp, /*partial_grad=*/true);
    replicate_parameter(b.ffn_norm.weight, tp, /*partial_grad=*/true);
  }
  if (norm) replicate_parameter(norm->weight, tp, /*partial_grad=*/true);
  if (output) shard_parameter(output->weight, 0, tp);  // vocabulary columns of the logits
}

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  TITAN_CHECK(output != nullptr || norm == nullptr, "llama3 with tied embeddings (tie_embeddings) cannot be sharded: the table is read "
                                 "both as the f32 embedding and as the bf16 output weight",
              "train the flavor untied, or on one rank");
  std::vector<nn::ShardingUnit> units;
  if (tok_embeddings) units.push_back({"tok_embeddings", tok_embeddings, true});
  for (size_t i = 0; i < layers.size(); ++i) units.push_back({"layers." + std::to_string(layers.index(i)), &layers[i], true});
  if (output) units.push_back({"output", output, false});
  return units;
}

}  // namespace titan::models::llama3
