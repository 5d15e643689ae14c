#include "titan/models/causal_lm.h"

#include "titan/autograd/ops.h"
#include "titan/distributed/tensor_parallel.h"

namespace titan::models {

std::string CausalLM::begin_step(int64_t /*step*/) { return {}; }

TrainingLoss CausalLM::training_loss(const Tensor& tokens, const Tensor& targets) {
  TrainingLoss out;
  out.total = next_token_loss(forward(tokens), targets);
  out.cross_entropy = out.total.value().item();
  return out;
}

autograd::Variable CausalLM::next_token_loss(const autograd::Variable& logits, const Tensor& targets) const {
  if (tp_) return distributed::cross_entropy_vocab_parallel(logits, targets, *tp_);
  return autograd::cross_entropy(logits, targets);
}

double CausalLM::evaluation_loss(const Tensor& tokens, const Tensor& targets) {
  return next_token_loss(forward(tokens), targets).value().item();
}

void CausalLM::end_step(const SumOverData& /*sum_over_data*/) {}

StepStats CausalLM::step_stats() { return {}; }

}  // namespace titan::models
