// What the trainer and the generator need from a model: a module tree that maps tokens to
// next-token logits, plus its FLOP count and a few switches. Each model family implements it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "titan/nn/module.h"

namespace titan::models {

// Activation checkpointing per transformer block: full recomputes the whole block in backward;
// selective keeps its GEMM and attention outputs and recomputes only the cheap ops between them.
enum class Recompute { none, full, selective };

class CausalLM : public nn::Module {
 public:
  // tokens [B, S] i32 -> logits [B*S, V] in the compute dtype (positions 0..S-1 per row).
  virtual autograd::Variable forward(const Tensor& tokens) = 0;
  // Training FLOPs per token at sequence length seq_len (TorchTitan's count, for MFU).
  virtual double training_flops_per_token(int64_t seq_len) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  virtual void set_compute_dtype(DType dtype) = 0;  // f32 or bf16 (mixed precision)
  virtual DType compute_dtype() const = 0;
  virtual void set_recompute(Recompute r) = 0;
  // Generation with a key/value cache (no autograd, f32): start_generation sizes the cache for
  // `batch` sequences of up to max_len tokens; decode consumes the next tokens [B, T] (the
  // first call is the prompt) and returns the logits [B, V] after each row's last token.
  virtual void start_generation(int64_t batch, int64_t max_len) = 0;
  virtual Tensor decode(const Tensor& tokens) = 0;
  // Called by the trainer after every optimizer step, for state updated outside autograd (MoE
  // aux-loss-free balancing: expert bias from the step's token counts).
  virtual void after_optimizer_step() {}
  // The targets [B*S] i32 of the next forward() (its tokens shifted by one), for models that also
  // predict further ahead (DeepSeek-V3's multi-token prediction); they feed only that forward.
  virtual void set_targets(const Tensor& /*targets*/) {}
  // Losses besides next-token cross-entropy from the last forward (e.g. MoE balance losses,
  // already weighted): the trainer adds them to the loss it differentiates.
  virtual std::vector<autograd::Variable> auxiliary_losses() { return {}; }
  // Extra scalars the model wants logged (e.g. MoE load balance, indexer loss); may be empty.
  virtual std::vector<std::pair<std::string, double>> step_stats() { return {}; }
};

// Options on top of a flavor ([model] keys of the job config).
struct ModelOptions {
  int64_t mtp_layers = 0;        // multi-token prediction modules (DeepSeek-V3 only)
  double mtp_loss_weight = 0.3;  // their loss weight lambda
  // deepseek_v3: the architecture of this Hugging Face config.json (a checkpoint converted by
  // `titan ckpt convert --from-hf` records it) instead of the flavor's; its vocabulary may
  // exceed the tokenizer's (DeepSeek pads it), never fall short.
  const nlohmann::json* hf_config = nullptr;
  // MoE balancing (DeepSeek models): the aux-loss-free bias update rate (TorchTitan's
  // load_balance_coeff) and the sequence-wise auxiliary loss weight (DeepSeek-V3's alpha; 0: off).
  double moe_load_balance_coeff = 1e-3;
  double moe_aux_loss_alpha = 0;
};

// Builds `name` ("llama3", ...) at `flavor` with the tokenizer's vocabulary size. The
// parameters are uninitialized: call init_parameters(seed) or load a checkpoint.
std::unique_ptr<CausalLM> build_model(const std::string& name, const std::string& flavor, int64_t vocab_size,
                                      int64_t max_seq_len, const ModelOptions& options = {});
std::vector<std::string> model_names();

}  // namespace titan::models
