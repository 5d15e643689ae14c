// What the trainer and the generator need from a model: a module tree that maps tokens to
// next-token logits, plus its FLOP count and a few switches. Each model family implements it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "titan/distributed/pipeline_stages.h"
#include "titan/models/aux_loss.h"
#include "titan/models/quantize.h"
#include "titan/models/recompute.h"
#include "titan/nn/module.h"

namespace titan::distributed {
class ProcessGroup;
}

namespace titan::models {

// One micro-batch's training loss, as the model computes it.
struct TrainingLoss {
  autograd::Variable total;  // [1]: what backward differentiates, cross-entropy + the weighted auxiliary terms
  double cross_entropy = 0;  // next-token cross-entropy, the mean over the batch's tokens (the logged "loss")
  // Each auxiliary loss, unweighted, under its metrics name (e.g. "mtp_loss", "indexer_loss").
  std::vector<std::pair<std::string, double>> terms;
};

// Statistics for the metrics: a few summaries for the console, everything in metrics.jsonl.
struct StepStats {
  std::vector<std::pair<std::string, double>> summary;  // e.g. "moe_imbalance_max" (over layers)
  std::vector<std::pair<std::string, double>> detail;   // e.g. "moe_imbalance/layer3"
};

// What one micro-batch's forward through one pipeline stage produced.
struct StageOutput {
  autograd::Variable hidden;  // the next stage's input: the residual stream (not on the last stage)
  // What the backward differentiates besides `hidden`: the last stage's loss plus the stage's own
  // auxiliary losses, as training_loss's total would add them (undefined: none).
  autograd::Variable loss;
  double cross_entropy = 0;  // the last stage's next-token cross-entropy (else 0)
  // The auxiliary losses' values on this stage, per name as TrainingLoss::terms: each a sum over
  // the stage's layers (modules) and how many it summed; the step's value of a term is its sum
  // over the stages divided by its count over the stages, or the sum alone when counts are 0.
  std::vector<std::pair<std::string, double>> term_sums;
  std::vector<int> term_counts;
};

// Sums a tensor in place over the data-parallel ranks (the identity on one rank).
using SumOverData = std::function<void(Tensor&)>;

class CausalLM : public nn::Module {
 public:
  // tokens [B, S] i32 -> logits [B*S, V] in the compute dtype (positions 0..S-1 per row). Under
  // tensor parallelism, [B*S, V / tp]: this rank's slice of the vocabulary.
  virtual autograd::Variable forward(const Tensor& tokens) = 0;
  // The mean next-token cross-entropy of forward()'s logits over targets [B*S] that are not -100
  // (loss parallel, distributed/tensor_parallel.h, when the logits are vocabulary-sharded).
  autograd::Variable next_token_loss(const autograd::Variable& logits, const Tensor& targets) const;
  // The mean next-token cross-entropy of a batch, tokens [B, S], targets [B*S], without
  // auxiliary losses (validation); over the whole sequences under context parallelism.
  double evaluation_loss(const Tensor& tokens, const Tensor& targets);
  // The tensor- and context-parallel groups the model is split over (null: none).
  const distributed::ProcessGroup* tensor_parallel() const { return tp_; }
  const distributed::ProcessGroup* context_parallel() const { return cp_; }
  // Training FLOPs per token at sequence length seq_len (TorchTitan's count, for MFU).
  virtual double training_flops_per_token(int64_t seq_len) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  virtual void set_compute_dtype(DType dtype) = 0;  // f32, bf16 or (llama3) f16 (mixed precision)
  virtual DType compute_dtype() const = 0;
  // The type activations flow in between ops: fp16 mixed precision rounds the GEMMs' operands and
  // outputs to f16 but keeps the other ops (norms, attention, the loss) in f32 (docs/precision.md).
  DType activation_dtype() const { return compute_dtype() == DType::f16 ? DType::f32 : compute_dtype(); }
  virtual void set_recompute(Recompute r) = 0;
  // Generation with a key/value cache (no autograd, f32): start_generation sizes the cache for
  // `batch` sequences of up to max_len tokens; decode consumes the next tokens [B, T] (the
  // first call is the prompt) and returns the logits [B, V] after each row's last token.
  virtual void start_generation(int64_t batch, int64_t max_len) = 0;
  virtual Tensor decode(const Tensor& tokens) = 0;

  // ---- training. Each optimizer step the trainer calls begin_step once, training_loss (then
  // backward) once per micro-batch, and end_step once after the optimizer; step_stats when it logs.
  //
  // Puts the model in its state for optimizer step `step` (1-based), e.g. DeepSeek-V3.2's DSA
  // stage; returns a line for the log when that state changed, else "".
  virtual std::string begin_step(int64_t step);
  // One micro-batch: tokens [B, S] i32, targets [B*S] i32 (the tokens shifted by one; -100 ignored).
  // stage_forward over one stage that holds the whole model: training runs one path, with
  // pipeline parallelism or without.
  TrainingLoss training_loss(const Tensor& tokens, const Tensor& targets);
  // State updated outside autograd once the optimizer has stepped (MoE's balancing bias from
  // the step's expert loads); sum_over_data sums a tensor over the data-parallel ranks in place.
  virtual void end_step(const SumOverData& sum_over_data);
  // Statistics since the last call (e.g. expert load); may be empty.
  virtual StepStats step_stats();

  // ---- parallelism (models/<model>/parallelize.cpp). The units of FSDP / DDP, in forward order.
  virtual std::vector<nn::ShardingUnit> sharding_units() = 0;

  // ---- the training forward, also pipeline parallelism's (ModelOptions::pipeline_stages;
  // train/pipeline_step.h runs it; the model then holds only its stages' parts). One micro-batch
  // through `stage` (one the model holds, or every block with the embedding and the head): tokens
  // [B, S] and targets [B*S] the micro-batch's, h the previous stage's output (undefined on the
  // first stage, which embeds the tokens); the stage's loss with its auxiliary terms returned.
  virtual StageOutput stage_forward(const distributed::pp::StageLayers& stage, const autograd::Variable& h,
                                    const Tensor& tokens, const Tensor& targets) = 0;
  // The activation that passes between stages for a micro-batch [batch, seq]: [tokens, dim].
  virtual Shape stage_activation_shape(int64_t batch, int64_t seq) const;
  // The auxiliary losses a step can report (TrainingLoss::terms' names), in a fixed order: each
  // pipeline rank reports all of them, 0 for those its stages lack.
  virtual std::vector<std::string> loss_term_names() const { return {}; }

 protected:
  // next_token_loss of forward(tokens) against targets [B*S], and its value. Under context
  // parallelism forward() returns this rank's chunks' logits: the loss is then this rank's mean
  // scaled by its share of the valid targets, so that the cp ranks' losses (and gradients) sum
  // to the mean over the whole sequences, which is the value returned (the same on every rank).
  std::pair<autograd::Variable, double> language_model_loss(const Tensor& tokens, const Tensor& targets);
  // The same from logits already computed for whole sequences of `tokens` [B, S] (this rank's
  // chunks of them under context parallelism): a pipeline's last stage.
  std::pair<autograd::Variable, double> sequence_loss(const autograd::Variable& logits, const Tensor& tokens,
                                                      const Tensor& targets) const;
  // Adds a stage's auxiliary losses to out.loss (in their order) and their values to its term sums
  // (per name: the values' sum, and their count for a name averaged over its terms, else 0).
  static void add_auxiliary_losses(StageOutput& out, const AuxLosses& aux);
  // The tokens [B, S] this rank runs and their positions: the whole sequences at 0..S-1, or under
  // context parallelism this rank's two chunks of each (distributed/context_parallel.h).
  std::pair<Tensor, Tensor> local_sequences(const Tensor& tokens) const;

  const distributed::ProcessGroup* tp_ = nullptr;  // set by a model built for tensor parallelism
  const distributed::ProcessGroup* cp_ = nullptr;  // set by a model that runs context parallel
};

// DeepSeek Sparse Attention training in two stages: a dense warm-up of warmup_steps steps that
// trains only the indexers, then the sparse stage (each query attends to its top-k keys).
struct DsaSchedule {
  int64_t warmup_steps = 0;          // 0: sparse from the first step
  double indexer_loss_coeff = 0.01;  // weight of the indexers' KL loss
  int64_t topk = 0;                  // keys per query; 0: the flavor's index_topk
  bool operator==(const DsaSchedule&) const = default;
};

// Options on top of a flavor ([model] keys of the job config).
struct ModelOptions {
  int64_t mtp_layers = 0;        // multi-token prediction modules (DeepSeek-V3 and V4)
  double mtp_loss_weight = 0.3;  // their loss weight lambda
  // deepseek_v3: the architecture of this Hugging Face config.json (a checkpoint converted by
  // `titan ckpt convert --from-hf` records it) instead of the flavor's; its vocabulary may
  // exceed the tokenizer's (DeepSeek pads it), never fall short.
  const nlohmann::json* hf_config = nullptr;
  // MoE balancing (DeepSeek models): the aux-loss-free bias update rate (TorchTitan's
  // load_balance_coeff) and the sequence-wise auxiliary loss weight (DeepSeek-V3's alpha; 0: off).
  double moe_load_balance_coeff = 1e-3;
  double moe_aux_loss_alpha = 0;
  // [model] converters: the fused or small-op form of each op that has both (models/converters.h).
  std::vector<std::string> converters;
  // The quantize.* converters' selections (models/quantize.h), from [model] converters and the
  // [quantize.*] sections.
  QuantizeOptions quantize;
  // DeepSeek-V3.2's sparse-attention training ([dsa]); only deepseek_v32 accepts a non-default one.
  DsaSchedule dsa;
  // Tensor + sequence parallelism over this group ([parallelism] tensor_parallel_degree; null or
  // one rank: none). The model is built with this rank's shards (models/<model>/parallelize.cpp).
  const distributed::ProcessGroup* tp = nullptr;
  // MoE layers under TP: false, each rank routes its own tokens (the MoE TP fix); true,
  // TorchTitan's all-gather with every expert's hidden units split ([parallelism] moe_tp_scheme).
  bool moe_tp_gather = false;
  // Async TP ([parallelism] enable_async_tensor_parallel): TP's collectives overlap the
  // projections' GEMMs (distributed/async_tensor_parallel.h).
  bool async_tp = false;
  // Pipeline parallelism: the stages this rank holds (distributed/pipeline_stages.h). The model
  // builds only their blocks (each under its global name), the embedding if it holds the first
  // and the final norm and output head (and MTP) if it holds the last. Empty: the whole model.
  std::vector<distributed::pp::StageLayers> pipeline_stages;
  // Expert parallelism over this group ([parallelism] expert_parallel_degree; null or one rank:
  // none): each rank holds its share of every MoE layer's routed experts (distributed/expert_parallel.h).
  const distributed::ProcessGroup* ep = nullptr;
  // Context parallelism over this group ([parallelism] context_parallel_degree; null or one rank:
  // none): each rank runs its chunks of every sequence (distributed/context_parallel.h).
  const distributed::ProcessGroup* cp = nullptr;
};

// Whether a parameter (or buffer) name is the token embedding's: "tok_embeddings." (DeepSeek-V4:
// transformers' "embed_tokens."). The other parts every family names alike: "layers.<i>." a block,
// "mtp.<k>." an MTP module, the rest (final norm, output head) the head. The pipeline and the
// memory planner place parameters on stages by these names.
bool is_embedding_parameter(const std::string& name);

// Builds `name` (a registered family, models/family.h) at `flavor` with the tokenizer's
// vocabulary size, refusing options the family has no use for. The parameters are
// uninitialized: call init_parameters(seed) or load a checkpoint.
std::unique_ptr<CausalLM> build_model(const std::string& name, const std::string& flavor, int64_t vocab_size,
                                      int64_t max_seq_len, const ModelOptions& options = {});
// The number of transformer blocks build_model would give the model (for the pipeline's stage split).
int64_t model_layers(const std::string& name, const std::string& flavor, int64_t vocab_size,
                     const ModelOptions& options = {});

}  // namespace titan::models
