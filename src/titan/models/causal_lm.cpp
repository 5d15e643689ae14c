#include "titan/models/causal_lm.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/common.h"

namespace titan::models {

std::string CausalLM::begin_step(int64_t /*step*/) { return {}; }

TrainingLoss CausalLM::training_loss(const Tensor& tokens, const Tensor& targets) {
  // One stage holding every block, the embedding and the head: the path a pipeline runs.
  const distributed::pp::StageLayers whole{0, std::numeric_limits<int>::max(), true, true};
  StageOutput stage = stage_forward(whole, {}, tokens, targets);
  TrainingLoss out;
  out.total = stage.loss;
  out.cross_entropy = stage.cross_entropy;
  for (const std::string& name : loss_term_names())  // in the model's order
    for (size_t k = 0; k < stage.term_sums.size(); ++k)
      if (stage.term_sums[k].first == name)  // a sum alone (count 0), else the mean
        out.terms.emplace_back(name, stage.term_sums[k].second / std::max(1, stage.term_counts[k]));
  return out;
}

void CausalLM::add_auxiliary_losses(StageOutput& out, const AuxLosses& aux) {
  for (const AuxLoss& a : aux) {
    out.loss = out.loss.defined() ? autograd::add(out.loss, a.weighted) : a.weighted;
    size_t k = 0;
    while (k < out.term_sums.size() && out.term_sums[k].first != a.name) ++k;
    if (k == out.term_sums.size()) out.term_sums.emplace_back(a.name, 0.0), out.term_counts.push_back(0);
    out.term_sums[k].second += a.value;
    if (a.averaged) ++out.term_counts[k];
  }
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

bool is_embedding_parameter(const std::string& name) {
  return name.starts_with("tok_embeddings.") || name.starts_with("embed_tokens.");
}

Shape CausalLM::stage_activation_shape(int64_t, int64_t) const {
  TITAN_FAIL("this model has no pipeline stages", "set parallelism.pipeline_parallel_degree = 1");
}

}  // namespace titan::models
