// AdamW over a model's parameters: f32 moments (category optimizer_state), decoupled weight
// decay applied only to the decay group (Parameter::weight_decay), one fused kernel per tensor.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/nn/module.h"

namespace titan::optim {

struct AdamWConfig {
  float lr = 8e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW {
 public:
  AdamW(std::vector<std::pair<std::string, nn::Parameter*>> params, const AdamWConfig& config);

  // One update with learning rate `lr` (the schedule's value for this step); the gradients are
  // multiplied by grad_scale first (clipping). Parameters without a gradient are skipped.
  void step(float lr, float grad_scale = 1.0f);
  int64_t steps_taken() const { return step_; }
  const AdamWConfig& config() const { return config_; }

  // Moments as "<param name>.exp_avg" / ".exp_avg_sq", plus "step" (an i64 scalar).
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source);

 private:
  struct Slot {
    std::string name;
    nn::Parameter* param;
    Tensor exp_avg, exp_avg_sq;
  };
  std::vector<Slot> slots_;
  AdamWConfig config_;
  int64_t step_ = 0;
};

}  // namespace titan::optim
