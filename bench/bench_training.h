// One model's training step as the benchmarks time it: a random batch of token ids (and targets)
// drawn once, then forward, backward, clipping at 1.0 and AdamW (lr 1e-4), as the trainer runs them.
#pragma once

#include <cstdint>

#include "titan/autograd/variable.h"
#include "titan/core/rng.h"
#include "titan/models/causal_lm.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"

namespace titan::bench {

class TrainingStep {
 public:
  TrainingStep(models::CausalLM& model, int64_t batch, int64_t seq, int64_t vocab)
      : model_(model),
        opt_(model.named_parameters(), {}),
        tokens_(Tensor::empty({batch, seq}, DType::i32)),
        targets_(Tensor::empty({batch * seq}, DType::i32)) {
    Generator g(0);
    for (int64_t i = 0; i < tokens_.numel(); ++i) tokens_.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(vocab)));
    for (int64_t i = 0; i < targets_.numel(); ++i) targets_.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(vocab)));
  }
  void operator()() {
    model_.zero_grad();
    models::TrainingLoss loss = model_.training_loss(tokens_, targets_);
    autograd::backward(loss.total);
    const auto norm = optim::clip_grad_norm(model_.named_parameters(), 1.0);
    opt_.step(1e-4f, norm.scale);
    model_.end_step([](Tensor&) {});
  }

 private:
  models::CausalLM& model_;
  optim::AdamW opt_;
  Tensor tokens_, targets_;
};

}  // namespace titan::bench
