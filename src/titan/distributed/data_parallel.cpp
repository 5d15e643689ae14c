#include "titan/distributed/data_parallel.h"

namespace titan::distributed {

SingleRank::SingleRank(nn::Module& model)
    : model_(model), params_(nn::trainable_params(model.named_parameters())), sums_(params_.size()), micro_batches_(-1) {}

void SingleRank::zero_grad() {
  model_.zero_grad();
  micro_batches_ = 0;
}

void SingleRank::begin_forward(bool /*sync_gradients*/) {
  if (micro_batches_ < 0) return;  // a forward outside a step (validation)
  if (micro_batches_ > 0) fold_micro_batch();
  ++micro_batches_;
}

void SingleRank::fold_micro_batch() {
  for (size_t i = 0; i < params_.size(); ++i) {
    autograd::Variable& v = params_[i].var;
    const std::shared_ptr<autograd::GradSlot>& slot = v.slot();
    if (!slot->grad.defined() || slot->stale) continue;  // no gradient reached it in this micro-batch
    sums_[i].add(slot->grad);
    v.clear_grad();  // the next micro-batch writes a fresh gradient
  }
}

void SingleRank::finish_backward() {
  if (micro_batches_ > 1) {
    fold_micro_batch();
    for (size_t i = 0; i < params_.size(); ++i) {
      if (sums_[i].empty()) continue;
      const std::shared_ptr<autograd::GradSlot>& slot = params_[i].var.slot();
      slot->grad = sums_[i].take();
      slot->stale = false;
    }
  }
  micro_batches_ = -1;
}

}  // namespace titan::distributed
