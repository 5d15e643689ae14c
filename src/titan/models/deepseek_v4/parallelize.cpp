// DeepSeek-V4's tensor + sequence parallel plan (DeepSeek-V3's, models/deepseek_v3/parallelize.cpp,
// carried over to V4's blocks).
//
// Sequence parallel: the residual streams [T / tp, N, d] are split by tokens, so everything that
// acts on each token alone runs on this rank's piece with its parameters replicated and their
// gradients partial (summed over TP after backward): the mHC maps (attn_hc, ffn_hc, hc_head: the
// Sinkhorn mix is per token), the RMSNorms, the MoE router.
//
// The attention gathers the tokens. On all of them, replicated (each rank sends back the partial
// gradient of its heads): the query down-projection q_a_proj and q_a_norm, the one key = value
// head (kv_proj, kv_norm) and the compressor (CSA / HCA entries are keys every head reads). The
// query up-projection q_b_proj is column-parallel by heads and the sinks split with them, so the
// attention runs on this rank's heads alone. The grouped output projection splits by groups:
// group g holds contiguous heads, so this rank's heads are whole groups when tp divides o_groups
// (checked), o_a_proj's rows of those groups go with them and o_b_proj is row-parallel, its
// partial sums reduce-scattered to this rank's tokens. The lightning indexer is replicated whole:
// its inputs are detached and its KL target (the attention probabilities' mean over the heads)
// is averaged over the ranks' heads by one all-reduce, so every rank computes the same indexer,
// selection and gradient; splitting its heads would add a reduction of every query's scores.
//
// The MoE follows parallelism.moe_tp_scheme as in V3 (models/moe/moe.h): "sequence", each rank
// routes its own tokens (hash layers: by their ids) to whole experts, the shared expert
// tensor-parallel; "gather", all tokens gathered and every expert's hidden units split. The
// embedding is vocabulary-parallel, lm_head column-parallel over the vocabulary (loss parallel).
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/deepseek_v4/model.h"
#include "titan/models/deepseek_v4/mtp.h"

namespace titan::models::deepseek_v4 {

void check_tensor_parallel(const DeepSeekV4Args& a, int64_t degree) {
  distributed::check_tensor_parallel_degree(degree, "deepseek_v4",
                                            {{"attention heads (n_heads)", a.n_heads},
                                             {"output groups (o_groups)", a.o_groups},
                                             {"vocabulary entries", a.vocab_size}});
}

void Transformer::place_tensor_parallel() {
  const distributed::ProcessGroup* tp = tp_;  // null: declare the plan only
  using distributed::replicate_parameter;
  using distributed::shard_parameter;
  const auto partial = [&](nn::Parameter& p) { replicate_parameter(p, tp, /*partial_grad=*/true); };
  const auto partial_all = [&](nn::Module& m) {
    for (auto& [name, p] : m.named_parameters()) partial(*p);
  };
  if (embed_tokens) shard_parameter(embed_tokens->weight, 0, tp);  // vocabulary rows
  if (hc_head) partial_all(*hc_head), partial(norm->weight);
  if (lm_head) shard_parameter(lm_head->weight, 0, tp);
  const auto place_layer = [&](DecoderLayer& b) {
    partial_all(b.attn_hc), partial_all(b.ffn_hc);
    partial(b.input_layernorm.weight), partial(b.post_attention_layernorm.weight);
    Attention& at = b.self_attn;
    for (nn::Parameter* p : {&at.q_a_proj.weight, &at.q_a_norm.weight, &at.kv_proj.weight, &at.kv_norm.weight}) partial(*p);
    shard_parameter(at.q_b_proj.weight, 0, tp);  // by heads
    shard_parameter(at.sinks, 0, tp);
    shard_parameter(at.o_a_proj.weight, 0, tp);  // by groups (rows g Ro ..)
    shard_parameter(at.o_b_proj.weight, 1, tp);  // row-parallel
    if (at.compressor) {
      Compressor& c = *at.compressor;
      for (nn::Parameter* p : {&c.kv_proj.weight, &c.gate_proj.weight, &c.position_bias, &c.kv_norm.weight}) partial(*p);
      if (c.indexer)  // whole and identical on every rank, gradients included
        for (auto& [name, p] : c.indexer->named_parameters()) replicate_parameter(*p, tp, /*partial_grad=*/false);
    }
    MoE& moe = b.mlp;
    partial(moe.router.gate.weight);  // its gradient: from this rank's tokens, or its hidden units' outputs
    if (moe.args().tp_gather) {       // TorchTitan: each expert's hidden units split (of its EP experts)
      shard_parameter(moe.experts.w1, 1, tp), shard_parameter(moe.experts.w3, 1, tp);
      shard_parameter(moe.experts.w2, 2, tp);
    } else if (moe.args().ep_degree() == 1) {  // the MoE TP fix: whole experts, this rank's tokens
      for (nn::Parameter* w : {&moe.experts.w1, &moe.experts.w2, &moe.experts.w3}) partial(*w);
    }  // else the fix with EP: the TP ranks are in the expert-parallel group and hold different experts
    if (moe.shared_experts) {
      shard_parameter(moe.shared_experts->w1.weight, 0, tp), shard_parameter(moe.shared_experts->w3.weight, 0, tp);
      shard_parameter(moe.shared_experts->w2.weight, 1, tp);
    }
  };
  for (size_t l = 0; l < layers.size(); ++l) place_layer(layers[l]);
  if (mtp)  // its block as a layer; the rest acts on each token alone (this rank's piece)
    for (size_t k = 0; k < mtp->size(); ++k) {
      MtpModule& m = (*mtp)[k];
      place_layer(m);
      for (nn::Parameter* p : {&m.e_proj.weight, &m.h_proj.weight, &m.enorm.weight, &m.hnorm.weight, &m.norm.weight})
        partial(*p);
      partial_all(m.hc_head);
    }
}

}  // namespace titan::models::deepseek_v4
