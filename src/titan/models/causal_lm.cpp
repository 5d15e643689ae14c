#include "titan/models/causal_lm.h"

#include "titan/autograd/ops.h"

namespace titan::models {

std::string CausalLM::begin_step(int64_t /*step*/) { return {}; }

TrainingLoss CausalLM::training_loss(const Tensor& tokens, const Tensor& targets) {
  TrainingLoss out;
  out.total = autograd::cross_entropy(forward(tokens), targets);
  out.cross_entropy = out.total.value().item();
  return out;
}

void CausalLM::end_step(const SumOverData& /*sum_over_data*/) {}

StepStats CausalLM::step_stats() { return {}; }

}  // namespace titan::models
