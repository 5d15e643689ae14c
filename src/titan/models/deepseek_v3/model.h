// DeepSeek-V3: token embedding, n_layers x (RMSNorm -> MLA -> residual, RMSNorm -> FFN ->
// residual), final RMSNorm, output projection. The first n_dense_layers blocks use a dense
// SwiGLU FFN ("feed_forward"); the others use a mixture of experts ("moe"). Parameter names
// follow TorchTitan v0.2 ("layers.3.attention.wkv_a.weight"); hf_adapter.h maps them to Hugging
// Face's.
//
// The MoE seam: this file does not define the MoE layer. The model takes a MoeFactory that builds
// each MoE block's FFN (the integrator passes one backed by models/moe); without one, MoE layers
// get a dense SwiGLU of inter_dim instead, registered as "feed_forward", and the model is the
// all-dense DeepSeek-V3 that args() then describes (n_dense_layers = n_layers + num_mtp_layers).
//
// With num_mtp_layers > 0 the model also holds the multi-token prediction modules ("mtp", mtp.h):
// a training forward (given the targets) appends their losses to its auxiliary losses.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "titan/models/block_ffn.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/args.h"
#include "titan/models/deepseek_v3/mla.h"

namespace titan::models::deepseek_v3 {

using models::BlockFeedForward;

// Throws unless `degree` tensor-parallel ranks split the heads, the vocabulary and the dense and
// shared FFN hidden sizes evenly, naming the degrees that would (parallelize.cpp). The lightning
// indexer and the routed experts stay whole on every rank.
void check_tensor_parallel(const DeepSeekV3Args& a, int64_t degree);

// Dense SwiGLU: w2(silu(w1 x) * w3 x). Under tensor parallelism (tp) this rank's hidden columns,
// taking and returning its sequence piece [N / tp, D] (all-gather in, reduce-scatter out).
class FeedForward : public BlockFeedForward {
 public:
  FeedForward(int64_t dim, int64_t hidden, double out_std, const distributed::ProcessGroup* tp = nullptr);
  Variable forward(const Variable& x, AuxLosses* aux = nullptr) override;
  void set_async_tensor_parallel(bool on) override { async_tp_ = on; }
  nn::Linear &w1, &w2, &w3;

 private:
  const distributed::ProcessGroup* tp_;
  bool async_tp_ = false;
};

// Builds the FFN of MoE layer `layer_id` (registered under the name "moe"), for tensor
// parallelism over tp (null: none).
using MoeFactory = std::function<std::unique_ptr<BlockFeedForward>(const DeepSeekV3Args&, int layer_id,
                                                                   const distributed::ProcessGroup* tp)>;

class MultiTokenPrediction;  // mtp.h

class TransformerBlock : public nn::Module {
 public:
  // tp: tensor + sequence parallelism (parallelize.cpp); x is then this rank's piece [N / tp, D].
  TransformerBlock(const DeepSeekV3Args& a, int layer_id, const MoeFactory& moe,
                   const distributed::ProcessGroup* tp = nullptr);
  // The block's auxiliary losses (the indexer's KL, MoE's balance loss) are appended to aux.
  Variable forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                   AuxLosses* aux = nullptr);
  // The same under activation checkpointing when recompute is not none: one region that also
  // returns the block's auxiliary losses (formed in its first, no-grad pass too, see
  // autograd::in_checkpointed_forward), so that they keep their graph through the recompute.
  Variable forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions, Recompute recompute,
                   AuxLosses* aux);
  // Inference through MLA's absorbed form and its latent cache (see Attention::forward_absorbed).
  Tensor decode(const Tensor& x, const kernels::RopeTables& rope, const Tensor& positions, LatentCache& cache,
                int64_t past);
  Attention& attention;
  BlockFeedForward& ffn;  // "feed_forward" (dense) or "moe"
  nn::RMSNorm &attention_norm, &ffn_norm;

 private:
  BlockFeedForward& build_ffn(const DeepSeekV3Args& a, int layer_id, const MoeFactory& moe,
                              const distributed::ProcessGroup* tp);
};

class Transformer : public CausalLM {
 public:
  // tp: tensor + sequence parallelism over this group (null or one rank: none; parallelize.cpp).
  // stages: the pipeline stages this rank holds (empty: the whole model; CausalLM::stage_forward).
  explicit Transformer(const DeepSeekV3Args& a, const MoeFactory& moe = {}, const distributed::ProcessGroup* tp = nullptr,
                       std::vector<distributed::pp::StageLayers> stages = {});
  // tokens [B, S] i32 -> logits [B*S, V] in the compute dtype (positions 0..S-1 per row). Under
  // context parallelism: the logits of this rank's chunks of each row, [B * 2 S/2cp, V]; under
  // tensor parallelism: this rank's vocabulary slice, [B*S, V / tp].
  Variable forward(const Tensor& tokens) override;
  Variable forward(const Tensor& tokens, const Tensor& positions);  // positions i32 [B, S]
  // The residual stream's start: Emb(tokens) [B, S, D], or this rank's piece [B*S / tp, D] of the
  // flattened tokens under TP (vocabulary-parallel). MTP embeds its shifted tokens with it.
  Variable embed(const Tensor& tokens);
  // The shared output head on a normed residual stream (embed's layout) -> logits [B*S, V], or
  // [B*S, V / tp] under TP (the pieces gathered first).
  Variable head(const Variable& normed);

  void set_compute_dtype(DType dtype) override;
  DType compute_dtype() const override { return compute_dtype_; }
  void set_recompute(Recompute r) override;
  std::vector<nn::ShardingUnit> sharding_units() override;  // parallelize.cpp
  Recompute recompute() const { return recompute_; }
  // TorchTitan's count; with DSA, that of the stage in force (top-k keys per query in the sparse
  // stage; the dense warm-up trains only the indexers, the rest runs forward).
  double training_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return args_.vocab_size; }
  int64_t max_seq_len() const override { return args_.max_seq_len; }
  // The architecture as built: n_dense_layers = n_layers when no MoeFactory was given.
  const DeepSeekV3Args& args() const { return args_; }
  const kernels::RopeTables& rope_tables() const { return rope_; }
  // Generation keeps one latent row (d_c + d_r values, plus the latent again as the value) per
  // token and layer: MLA's absorbed form, not per-head keys and values.
  void start_generation(int64_t batch, int64_t max_len) override;
  Tensor decode(const Tensor& tokens) override;
  // DeepSeek-V3.2 (args().has_indexer()): the DSA stage, implementation and indexer-loss weight
  // of every layer (dsa.h); topk > 0 overrides the flavor's index_topk. dense_warmup freezes every
  // parameter outside the indexers (requires_grad off, gradients released, so the tape records
  // nothing for them and the optimizer skips them); sparse makes all trainable again. Until it is
  // called the model is in the sparse stage with the small-op path and coefficient 0.01.
  void set_dsa(DsaStage stage, DsaImpl impl, double indexer_loss_coeff, int64_t topk = 0);
  // The schedule begin_step follows (V3.2 only): the dense warm-up for the first
  // schedule.warmup_steps steps, then sparse, both with `impl`.
  void set_dsa_schedule(const DsaSchedule& schedule, DsaImpl impl);
  // forward(tokens) for training: the logits, and the losses besides the main cross-entropy
  // appended to aux in forward order (each layer's indexer KL and MoE balance loss, then MTP's
  // per-module losses against targets [B*S], their MTP blocks' among them).
  Variable forward(const Tensor& tokens, const Tensor& targets, AuxLosses& aux);
  // Context parallelism over `cp` (null or one rank: none; distributed/context_parallel.h): dense
  // MLA by ring attention (distributed/ring_attention.h), DeepSeek-V3.2's sparse stage (fused
  // kernels only) by gathering the latent rows; MTP on each rank's chunks. Throws, naming the
  // setting to change, for V3.2's dense warm-up and the sequence-wise balance loss.
  void set_context_parallel(const distributed::ProcessGroup* cp);
  // Async TP (distributed/async_tensor_parallel.h), every block and MTP module: the attention's
  // token gather overlaps wq_a / wkv_a (or wq), wo's reduce-scatter its GEMM, and the dense FFNs
  // and shared experts likewise; routed experts have no TP collective (the MoE TP fix). No
  // effect without TP.
  void set_async_tensor_parallel(bool on);

  // Training (CausalLM): begin_step switches the DSA stage by the schedule; stage_forward adds
  // the auxiliary losses and reports "mtp_loss", "indexer_loss" (the unweighted mean over layers)
  // and "moe_aux_loss"; end_step updates the MoE balancing biases from the step's expert loads
  // summed over data-parallel ranks (not during the dense warm-up: those loads join the first
  // sparse step's update); step_stats reports the expert load.
  std::string begin_step(int64_t step) override;
  void end_step(const SumOverData& sum_over_data) override;
  StepStats step_stats() override;

  // Pipeline parallelism (CausalLM::stage_forward): the stages' blocks and each part they need,
  // null where none does: the embedding for the first stage (and MTP), the final norm, output head
  // and MTP modules for the last.
  StageOutput stage_forward(const distributed::pp::StageLayers& stage, const Variable& h, const Tensor& tokens,
                            const Tensor& targets) override;
  Shape stage_activation_shape(int64_t batch, int64_t seq) const override;
  std::vector<std::string> loss_term_names() const override;

  nn::Embedding* tok_embeddings = nullptr;
  nn::ModuleList<TransformerBlock>& layers;
  nn::RMSNorm* norm = nullptr;
  nn::Linear* output = nullptr;
  MultiTokenPrediction* mtp = nullptr;  // "mtp", when num_mtp_layers > 0

 private:
  // forward on tokens and positions [B, L] (this rank's chunks under CP) of the sequences `whole`
  // [B, S] (tokens itself without CP), which MTP shifts; with targets and aux (both or neither)
  // the auxiliary losses, MTP's included, are appended to aux.
  Variable run(const Tensor& tokens, const Tensor& positions, const Tensor& whole, const Tensor* targets,
               AuxLosses* aux);
  // Every MLA layer with DeepSeek Sparse Attention: the main layers', then the MTP blocks'.
  std::vector<Attention*> dsa_attentions();
  void place_tensor_parallel();  // parallelize.cpp: each parameter's TP placement
  DeepSeekV3Args args_;
  kernels::RopeTables rope_;
  DType compute_dtype_ = DType::f32;
  Recompute recompute_ = Recompute::none;
  std::vector<LatentCache> cache_;  // per layer
  int64_t cache_len_ = 0;
  DsaSchedule dsa_schedule_;
  DsaImpl dsa_impl_ = DsaImpl::small_ops;
  std::optional<DsaStage> scheduled_stage_;  // the stage begin_step last set
};

}  // namespace titan::models::deepseek_v3
