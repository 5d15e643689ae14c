#include "titan/models/causal_lm.h"

#include <span>
#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/cross_entropy.h"

namespace titan::models {

std::string CausalLM::begin_step(int64_t /*step*/) { return {}; }

TrainingLoss CausalLM::training_loss(const Tensor& tokens, const Tensor& targets) {
  TrainingLoss out;
  std::tie(out.total, out.cross_entropy) = language_model_loss(tokens, targets);
  return out;
}

std::pair<autograd::Variable, double> CausalLM::language_model_loss(const Tensor& tokens, const Tensor& targets) {
  if (!cp_) {
    autograd::Variable ce = next_token_loss(forward(tokens), targets);  // loss parallel under TP
    return {ce, ce.value().item()};
  }
  const distributed::CpLayout layout = distributed::cp_layout(*cp_, tokens.size(1));
  const Tensor mine = distributed::local_chunks(targets.view(tokens.shape()), layout);
  const Tensor mine_flat = mine.view({mine.numel()});
  autograd::Variable ce = next_token_loss(forward(tokens), mine_flat);  // the mean over this rank's valid tokens
  double valid = 0;
  for (int64_t i = 0; i < mine_flat.numel(); ++i) valid += mine_flat.data<int32_t>()[i] != kernels::kIgnoreIndex;
  double sums[2] = {ce.value().item() * valid, valid};
  cp_->all_reduce(std::span<double>(sums, 2));
  if (sums[1] == 0) return {autograd::scale(ce, 0.0), 0.0};
  return {autograd::scale(ce, valid / sums[1]), sums[0] / sums[1]};
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

}  // namespace titan::models
