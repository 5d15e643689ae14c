// DeepSeek-V4 (transformers' DeepseekV4ForCausalLM; ../shared/reference/v4_transformers.md
// section 2): the token embedding copied into hc_mult residual streams, n_layers decoder layers
// (each an attention and an MoE block, each wrapped by a hyper-connection), the HyperHead that
// collapses the streams, the final RMSNorm and the output head. Names follow transformers'
// state dict without its "model." prefix (embed_tokens, layers.N.attn_hc, layers.N.self_attn,
// layers.N.mlp, hc_head, norm, lm_head); hf_adapter.h maps the few that differ. With
// num_mtp_layers > 0 the model also holds the multi-token prediction modules ("mtp", mtp.h),
// which only the training forward (stage_forward) runs.
//
// Pipeline parallelism (ModelOptions::pipeline_stages): a rank's model holds only its stages'
// layers (under their global names), the embedding if it holds the first stage and the HyperHead,
// final norm and output head if it holds the last. What passes between stages is the whole
// residual, hc_mult streams per token.
#pragma once

#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/models/deepseek_v4/attention.h"
#include "titan/models/deepseek_v4/hyper_connection.h"
#include "titan/models/deepseek_v4/moe.h"

namespace titan::models::deepseek_v4 {

// Throws unless tensor parallelism of `degree` divides what it splits (parallelize.cpp), naming
// the sizes and the degrees that work.
void check_tensor_parallel(const DeepSeekV4Args& a, int64_t degree);

class DecoderLayer : public nn::Module {
 public:
  // moe: the layer's MoE arguments but its architecture (the parallel groups, moe_args sets the rest).
  DecoderLayer(const DeepSeekV4Args& a, int64_t layer, const models::moe::MoEArgs& moe = {});
  // streams [T, N, d] (T = B S tokens at positions [B, S], ids [T] i32) -> [T, N, d].
  Variable forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                   const kernels::RopeTables& rope, AuxLosses* aux) const;
  // The same as one activation-checkpoint region under full / selective recompute.
  Variable forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                   const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux);

  HyperConnection& attn_hc;
  nn::RMSNorm& input_layernorm;
  Attention& self_attn;
  HyperConnection& ffn_hc;
  nn::RMSNorm& post_attention_layernorm;
  MoE& mlp;
  const LayerType type;
  DType experts_dtype = DType::f32;  // the experts' GEMM dtype: bf16 under mixed precision (the router stays f32)

 protected:
  // The recompute forward without opening this layer's unit: an MTP module (mtp.h), a unit
  // itself, runs its block inside its own scope.
  Variable forward_in_unit(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                           const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux);
};

class MultiTokenPrediction;  // mtp.h

class Transformer : public CausalLM {
 public:
  // stages: the pipeline stages this rank holds (empty: the whole model); groups: the MoE's
  // parallel groups (ep: its routed experts divided over; tp, tp_gather: tensor parallelism,
  // which then runs the whole model tensor + sequence parallel, parallelize.cpp).
  explicit Transformer(const DeepSeekV4Args& a, const std::vector<distributed::pp::StageLayers>& stages = {},
                       const models::moe::MoEArgs& groups = {});

  Variable forward(const Tensor& tokens) override;  // [B, S] i32 -> logits [B S, V]
  double training_flops_per_token(int64_t seq_len) const override;
  int64_t vocab_size() const override { return args_.vocab_size; }
  int64_t max_seq_len() const override { return args_.max_seq_len; }
  void set_compute_dtype(DType dtype) override;
  DType compute_dtype() const override { return compute_dtype_; }
  void set_recompute(Recompute r) override { recompute_ = r; }
  void start_generation(int64_t batch, int64_t max_len) override;
  Tensor decode(const Tensor& tokens) override;
  std::vector<nn::ShardingUnit> sharding_units() override;
  StageOutput stage_forward(const distributed::pp::StageLayers& stage, const Variable& h, const Tensor& tokens,
                            const Tensor& targets) override;
  std::vector<std::string> loss_term_names() const override;
  // After each optimizer step, the learned layers' balancing biases move by their expert loads
  // (models/moe/moe.h); step_stats reports every layer's load.
  void end_step(const SumOverData& sum_over_data) override;
  StepStats step_stats() override;
  // The residual streams [tokens, hc_mult, dim] of this rank's tokens (its chunks under CP): every
  // stream of every token crosses a stage boundary (the blocks and an expert exchange carry one
  // dim-wide row per token).
  Shape stage_activation_shape(int64_t batch, int64_t seq) const override;
  // CSA indexers learn from their KL loss with this weight (0: not at all, as transformers).
  void set_indexer_loss_coeff(double coeff);
  // Context parallelism over cp (null or one rank: none): each rank runs its two chunks of every
  // sequence (distributed/context_parallel.h); the attention exchanges what Attention::cp says.
  void set_context_parallel(const distributed::ProcessGroup* cp);
  const DeepSeekV4Args& args() const { return args_; }

  nn::Embedding* embed_tokens = nullptr;  // the first stage's (null on a rank without it)
  nn::ModuleList<DecoderLayer>& layers;   // this rank's stages' layers
  HyperHead* hc_head = nullptr;           // hc_head, norm and lm_head: the last stage's
  nn::RMSNorm* norm = nullptr;
  nn::Linear* lm_head = nullptr;
  MultiTokenPrediction* mtp = nullptr;    // "mtp" (num_mtp_layers > 0): the last stage's

  // tokens [B, S] -> their embedding [B S, d] (f32), before the copy into the streams.
  Variable token_embedding(const Tensor& tokens);
  // The final-normed rows [B S, d] through the shared output head: logits [B S, V].
  Variable output(const Variable& normed);
  const kernels::RopeTables& sliding_rope() const { return rope_main_; }
  Recompute recompute() const { return recompute_; }

 private:
  // This rank's part of tokens [B, S] i32 (its two chunks of each sequence under CP, else all of
  // it), checked: the tokens [B, L], their global positions [B, L] and their ids [B L].
  struct LocalTokens {
    Tensor tokens, positions, ids;
  };
  LocalTokens local_tokens(const Tensor& tokens) const;
  // tokens [B, S] -> the embedding copied into every stream [B S, N, d].
  Variable embed(const Tensor& tokens);
  // The streams through the held layers whose index is in [begin, end); ids [B S] i32.
  Variable run_layers(Variable streams, const Tensor& positions, const Tensor& ids, int begin, int end, AuxLosses* aux);
  // The streams collapsed, normed and projected: logits [B S, V].
  Variable head(const Variable& streams);
  // Every decoder layer this rank holds: the main ones, then the MTP modules' blocks.
  std::vector<DecoderLayer*> decoder_layers();
  bool whole() const { return embed_tokens && lm_head && int64_t(layers.size()) == args_.n_layers; }
  const kernels::RopeTables& rope_of(LayerType t) const { return t == LayerType::sliding ? rope_main_ : rope_compress_; }

  void place_tensor_parallel();  // parallelize.cpp: each parameter's TP placement

  DeepSeekV4Args args_;
  kernels::RopeTables rope_main_, rope_compress_;
  Recompute recompute_ = Recompute::none;
  DType compute_dtype_ = DType::f32;
  Tensor generated_;  // generation: every token so far [B, n] (no cache: each step reruns them)
  int64_t generated_len_ = 0;
};

}  // namespace titan::models::deepseek_v4
