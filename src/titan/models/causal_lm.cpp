#include "titan/models/causal_lm.h"

#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/common.h"

namespace titan::models {

std::string CausalLM::begin_step(int64_t /*step*/) { return {}; }

TrainingLoss CausalLM::training_loss(const Tensor& tokens, const Tensor& targets) {
  TrainingLoss out;
  std::tie(out.total, out.cross_entropy) = language_model_loss(tokens, targets);
  return out;
}

std::pair<autograd::Variable, double> CausalLM::language_model_loss(const Tensor& tokens, const Tensor& targets) {
  return sequence_loss(forward(tokens), tokens, targets);  // loss parallel under TP
}

std::pair<autograd::Variable, double> CausalLM::sequence_loss(const autograd::Variable& logits, const Tensor& tokens,
                                                               const Tensor& targets) const {
  if (!cp_) {
    autograd::Variable ce = next_token_loss(logits, targets);
    return {ce, ce.value().item()};
  }
  const distributed::CpLayout layout = distributed::cp_layout(*cp_, tokens.size(1));
  const Tensor mine = distributed::local_chunks(targets.view(tokens.shape()), layout);
  const Tensor mine_flat = mine.view({mine.numel()});
  return distributed::mean_over_sequences(next_token_loss(logits, mine_flat), mine_flat, *cp_);
}

std::pair<Tensor, Tensor> CausalLM::local_sequences(const Tensor& tokens) const {
  if (!cp_) return {tokens, default_positions(tokens.size(0), tokens.size(1))};
  const distributed::CpLayout layout = distributed::cp_layout(*cp_, tokens.size(1));
  return {distributed::local_chunks(tokens, layout), distributed::local_positions(tokens.size(0), layout)};
}

autograd::Variable CausalLM::next_token_loss(const autograd::Variable& logits, const Tensor& targets) const {
  if (tp_) return distributed::cross_entropy_vocab_parallel(logits, targets, *tp_);
  return autograd::cross_entropy(logits, targets);
}

double CausalLM::evaluation_loss(const Tensor& tokens, const Tensor& targets) {
  return language_model_loss(tokens, targets).second;
}

void CausalLM::end_step(const SumOverData& /*sum_over_data*/) {}

StepStats CausalLM::step_stats() { return {}; }

StageOutput CausalLM::stage_forward(const distributed::pp::StageLayers&, const autograd::Variable&, const Tensor&,
                                    const Tensor&) {
  TITAN_FAIL("this model has no pipeline stages", "set parallelism.pipeline_parallel_degree = 1");
}

Shape CausalLM::stage_activation_shape(int64_t, int64_t) const {
  TITAN_FAIL("this model has no pipeline stages", "set parallelism.pipeline_parallel_degree = 1");
}

}  // namespace titan::models
