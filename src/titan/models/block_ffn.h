// The feed-forward half of a transformer block, as a model assembles it: a dense SwiGLU or a
// mixture of experts behind one interface, so MoE layers plug into any model family.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "titan/models/aux_loss.h"
#include "titan/models/causal_lm.h"
#include "titan/nn/module.h"

namespace titan::models {

class BlockFeedForward : public nn::Module {
 public:
  // x [B, S, D] -> [B, S, D]; an auxiliary loss (e.g. MoE's sequence-wise balance loss) is
  // appended to `aux` when given.
  virtual autograd::Variable forward(const autograd::Variable& x, AuxLosses* aux = nullptr) = 0;
  // Run after every optimizer step (e.g. MoE's load-balancing bias update from the step's
  // expert loads, summed over data-parallel ranks by sum_over_data).
  virtual void end_step(const SumOverData& sum_over_data) { (void)sum_over_data; }
  // Run instead of end_step after a step that froze this block (no update of its own).
  virtual void end_frozen_step(const SumOverData& sum_over_data) { (void)sum_over_data; }
  // Async TP (distributed/async_tensor_parallel.h): its TP collectives overlap its projections'
  // GEMMs. No effect without TP, or where the FFN has no asynchronous form.
  virtual void set_async_tensor_parallel(bool on) { (void)on; }
  // Adds this block's statistics for the metrics (layer index given), e.g. MoE expert load.
  virtual void append_stats(StepStats& stats, int layer) {
    (void)stats;
    (void)layer;
  }
};

}  // namespace titan::models
