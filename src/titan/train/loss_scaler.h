// Dynamic loss scaling for fp16 training (PyTorch's torch.amp.GradScaler, with its names).
//
// The loss is multiplied by scale() before backward, so that small gradients survive f16's narrow
// range; the optimizer sees the gradients divided by it again. A step whose gradients overflowed
// (an infinity or NaN on any rank: the trainer decides collectively and tells update()) is skipped
// and the scale backs off; growth_interval finite steps in a row grow it.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace titan::train {

struct LossScalerOptions {
  double init = 32768;  // seed 003's and GradScaler's (2^16 there) starting points
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& o) : o_(o), scale_(o.init) {}

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }  // overflowed steps since the run began
  bool at_minimum() const { return scale_ <= o_.min_scale; }

  // After each step: overflow (any rank's gradients not finite) backs the scale off, never below
  // min_scale, and counts a skipped step; a finite step counts toward growth.
  void update(bool overflow);

  // The checkpoint's train state: the scale, the finite steps since the last change, the skips.
  nlohmann::json state() const;
  void load(const nlohmann::json& state);

 private:
  LossScalerOptions o_;
  double scale_;
  int64_t growth_tracker_ = 0;  // finite steps since the scale last changed
  int64_t skipped_ = 0;
};

}  // namespace titan::train
