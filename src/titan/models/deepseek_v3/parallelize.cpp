// DeepSeek-V3 / V3.2's parallel plan.
//
// Data parallel (TorchTitan's deepseek_v3 parallelize.py): one FSDP / DDP unit for the token
// embedding, one per transformer block (its MoE experts included: under expert parallelism FSDP
// shards them over the expert-FSDP group, distributed/expert_parallel.h), one per MTP module
// (which also reuses the embedding and the head), one for the output head, in the order the
// forward first runs them; the final norm is in the root unit.
//
// Tensor + sequence parallel (TorchTitan's MLA plan with torchtitan-npu's fixes): the residual
// stream and the norms are sequence-parallel; MLA's down-projections (wq_a, wkv_a) and their
// norms are replicated and computed on the gathered tokens directly (no slice, no all-reduce of
// their outputs: each rank's heads send back partial gradients, summed over TP after backward);
// wq / wq_b and wkv_b are column-parallel by heads, wo row-parallel. The lightning indexer is
// replicated (its inputs are detached and its KL target is summed over the ranks' heads, so every
// rank computes the same indexer, selection and gradient; splitting its 64 heads would add a
// reduction of the index scores of every query and key). Dense FFNs are column / row parallel.
// MoE follows the MoE TP fix (parallelism.moe_tp_scheme = "sequence", models/moe/moe.h): each
// rank routes its own sequence piece to the replicated routed experts, the shared experts run
// tensor-parallel; under expert parallelism the TP ranks join the expert-parallel group (the
// routed experts are then divided over them, not replicated); or TorchTitan's scheme ("gather"):
// all tokens gathered, every expert's hidden units split (under expert parallelism too: each TP
// rank then exchanges all the tokens within its own EP group). The embedding is vocabulary-parallel and the head column-parallel over the
// vocabulary (loss parallel).
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v3/mtp.h"
#include "titan/models/moe/moe.h"

namespace titan::models::deepseek_v3 {

void check_tensor_parallel(const DeepSeekV3Args& a, int64_t degree) {
  std::vector<std::pair<std::string, int64_t>> splits = {{"attention heads", a.n_heads},
                                                         {"vocabulary entries", a.vocab_size}};
  if (a.n_dense_layers > 0) splits.emplace_back("dense FFN hidden units", a.inter_dim);
  distributed::check_tensor_parallel_degree(degree, "deepseek", splits);
}

void Transformer::place_tensor_parallel() {
  const distributed::ProcessGroup* tp = tp_;  // null: declare the plan only
  using distributed::replicate_parameter;
  using distributed::shard_parameter;
  const auto colwise = [&](nn::Linear& l) { shard_parameter(l.weight, 0, tp); };
  const auto rowwise = [&](nn::Linear& l) { shard_parameter(l.weight, 1, tp); };
  const auto partial = [&](nn::Parameter& p) { replicate_parameter(p, tp, /*partial_grad=*/true); };
  if (output) colwise(*output);
  if (tok_embeddings) shard_parameter(tok_embeddings->weight, 0, tp);  // vocabulary rows
  if (norm) partial(norm->weight);
  const auto place_block = [&](TransformerBlock& b, const std::string& name) {
    Attention& at = b.attention;
    if (at.wq) {
      colwise(*at.wq);
    } else {
      partial(at.wq_a->weight);
      partial(at.q_norm->weight);
      colwise(*at.wq_b);
    }
    partial(at.wkv_a.weight);
    partial(at.kv_norm.weight);
    colwise(at.wkv_b);
    rowwise(at.wo);
    if (at.indexer)  // whole and identical on every rank, gradients included
      for (auto& [param_name, p] : at.indexer->named_parameters()) replicate_parameter(*p, tp, /*partial_grad=*/false);
    partial(b.attention_norm.weight);
    partial(b.ffn_norm.weight);
    if (auto* dense = dynamic_cast<FeedForward*>(&b.ffn)) {
      colwise(dense->w1), colwise(dense->w3), rowwise(dense->w2);
    } else if (auto* moe = dynamic_cast<moe::MoE*>(&b.ffn)) {
      partial(moe->router.gate.weight);  // its gradient: from this rank's tokens, or its hidden units' outputs
      if (moe->args().tp_gather) {       // TorchTitan: each expert's hidden units split (of its EP experts)
        shard_parameter(moe->experts.w1, 1, tp), shard_parameter(moe->experts.w3, 1, tp);
        shard_parameter(moe->experts.w2, 2, tp);
      } else if (moe->args().ep_degree() == 1) {  // the MoE TP fix: whole experts, this rank's tokens
        for (nn::Parameter* w : {&moe->experts.w1, &moe->experts.w2, &moe->experts.w3}) partial(*w);
      }  // else the fix with EP: the TP ranks are in the expert-parallel group and hold different experts
      if (moe->shared_experts) {
        colwise(moe->shared_experts->w1), colwise(moe->shared_experts->w3), rowwise(moe->shared_experts->w2);
      }
    } else {  // a stand-in feed-forward (tests) runs whole, and only without TP
      TITAN_CHECK(tp == nullptr, "deepseek_v3: " + name + "'s feed-forward has no tensor-parallel plan");
    }
  };
  for (size_t l = 0; l < layers.size(); ++l) place_block(layers[l], "layer " + std::to_string(layers.index(l)));
  if (mtp) {  // MTP: the shifted embedding goes through the sharded table; the rest is replicated
    for (size_t k = 0; k < mtp->size(); ++k) {
      MtpModule& m = (*mtp)[k];
      for (nn::Parameter* p : {&m.enorm.weight, &m.hnorm.weight, &m.eh_proj.weight, &m.norm.weight}) partial(*p);
      place_block(m.block, "mtp." + std::to_string(k));
    }
  }
}

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  std::vector<nn::ShardingUnit> units;
  if (tok_embeddings) units.push_back({"tok_embeddings", tok_embeddings, true});
  for (size_t l = 0; l < layers.size(); ++l) units.push_back({"layers." + std::to_string(layers.index(l)), &layers[l], true});
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) units.push_back({"mtp." + std::to_string(k), &(*mtp)[k], true});
  if (output) units.push_back({"output", output, false});
  return units;
}

}  // namespace titan::models::deepseek_v3
