// AdamW over a model's parameters: f32 moments (category optimizer_state), decoupled weight
// decay applied only to the decay group (Parameter::weight_decay), one fused kernel per tensor.
// Each parameter counts its own updates for the bias corrections (as PyTorch's per-parameter
// state["step"]): one frozen for the first N steps (DSA's dense warm-up trains only the
// indexers) starts with the corrections of update 1, not of update N + 1.
//
// With a Swap the moments live in a file instead (swapped_moments.h) and step() streams them
// through two chunk buffers; the arithmetic is the same kernel on the same values, so the
// parameters come out bit for bit as they do in memory.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "titan/kernels/adamw_params.h"
#include "titan/nn/module.h"
#include "titan/optim/optimizer.h"

namespace titan::optim {

class SwappedMoments;

class AdamW final : public Optimizer {
 public:
  // config: the base values lr, betas, eps and weight_decay (the per-step fields are ignored).
  // The moments take the shape of each TrainableParam's value: the whole parameter, or under
  // FSDP this rank's shard (the optimizer then steps the local shard only).
  AdamW(std::vector<nn::TrainableParam> params, const kernels::AdamWParams& config,
        const std::optional<Swap>& swap = std::nullopt);
  ~AdamW() override;
  AdamW(const std::vector<std::pair<std::string, nn::Parameter*>>& params, const kernels::AdamWParams& config)
      : AdamW(nn::trainable_params(params), config) {}

  // One update with learning rate `lr` (the schedule's value for this step); the gradients are
  // multiplied by grad_scale first (clipping). Parameters without a gradient (frozen, or unused
  // this step) are skipped, and their update count stays as it was.
  void step(float lr, float grad_scale = 1.0f) override;
  std::string name() const override { return "AdamW"; }
  // Calls of step(), whether or not they updated anything.
  int64_t steps_taken() const { return step_; }
  // Updates parameter `name` has received (the t of its bias corrections).
  int64_t param_steps(const std::string& name) const;
  const kernels::AdamWParams& config() const { return config_; }
  // The swapped moments, or null when they are in memory.
  const SwappedMoments* swapped() const { return swapped_.get(); }

  // Moments as "<param name>.exp_avg" / ".exp_avg_sq", the update count as "<param name>.step",
  // plus "step" (i64 scalars). A state without the per-parameter counts (saved before they
  // existed) loads with "step" as every parameter's count. Swapped moments are read into new
  // tensors (category temporaries).
  std::vector<std::pair<std::string, Tensor>> state_dict() const override;
  std::vector<std::pair<std::string, Shape>> state_shapes() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) override;
  SavedState state_for_save() const override;

 private:
  struct Slot {
    nn::TrainableParam param;
    Tensor exp_avg, exp_avg_sq;  // undefined when swapped
    int64_t steps = 0;           // updates this parameter has received
    kernels::AdamWParams constants;  // this step's
    bool updating = false;       // has a gradient this step
  };
  // Fills in each slot's constants for this step; false for a slot without a gradient.
  bool prepare(Slot& s, float lr, float grad_scale);
  void update(Slot& s, int64_t begin, int64_t n, float* exp_avg, float* exp_avg_sq);
  std::vector<Slot> slots_;
  kernels::AdamWParams config_;
  int64_t step_ = 0;
  std::unique_ptr<SwappedMoments> swapped_;
  bool broken_ = false;  // a swapped step failed midway; a load_state_dict repairs it
  void check_usable() const;
};

}  // namespace titan::optim
