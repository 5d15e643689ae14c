// AdamW over a model's parameters: f32 moments (category optimizer_state), decoupled weight
// decay applied only to the decay group (Parameter::weight_decay), one fused kernel per tensor.
// Each parameter counts its own updates for the bias corrections (as PyTorch's per-parameter
// state["step"]): one frozen for the first N steps (DSA's dense warm-up trains only the
// indexers) starts with the corrections of update 1, not of update N + 1.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/kernels/adamw_params.h"
#include "titan/nn/module.h"

namespace titan::optim {

class AdamW {
 public:
  // config: the base values lr, betas, eps and weight_decay (the per-step fields are ignored).
  // The moments take the shape of each TrainableParam's value: the whole parameter, or under
  // FSDP this rank's shard (the optimizer then steps the local shard only).
  AdamW(std::vector<nn::TrainableParam> params, const kernels::AdamWParams& config);
  AdamW(const std::vector<std::pair<std::string, nn::Parameter*>>& params, const kernels::AdamWParams& config)
      : AdamW(nn::trainable_params(params), config) {}

  // One update with learning rate `lr` (the schedule's value for this step); the gradients are
  // multiplied by grad_scale first (clipping). Parameters without a gradient (frozen, or unused
  // this step) are skipped, and their update count stays as it was.
  void step(float lr, float grad_scale = 1.0f);
  // Calls of step(), whether or not they updated anything.
  int64_t steps_taken() const { return step_; }
  // Updates parameter `name` has received (the t of its bias corrections).
  int64_t param_steps(const std::string& name) const;
  const kernels::AdamWParams& config() const { return config_; }

  // Moments as "<param name>.exp_avg" / ".exp_avg_sq", the update count as "<param name>.step",
  // plus "step" (i64 scalars). A state without the per-parameter counts (saved before they
  // existed) loads with "step" as every parameter's count.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source);

 private:
  struct Slot {
    nn::TrainableParam param;
    Tensor exp_avg, exp_avg_sq;
    int64_t steps = 0;  // updates this parameter has received
  };
  std::vector<Slot> slots_;
  kernels::AdamWParams config_;
  int64_t step_ = 0;
};

}  // namespace titan::optim
