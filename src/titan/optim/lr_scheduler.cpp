#include "titan/optim/lr_scheduler.h"

#include <cmath>
#include <numbers>
#include <string>

#include "titan/core/error.h"

namespace titan::optim {

LrSchedule::LrSchedule(int64_t total_steps, int64_t warmup_steps, std::optional<double> decay_ratio,
                       LrDecay decay, double min_lr_factor)
    : total_steps_(total_steps), warmup_steps_(warmup_steps), decay_(decay), min_lr_factor_(min_lr_factor) {
  TITAN_CHECK(total_steps >= 1, "LR schedule needs at least one step, got total_steps=" + std::to_string(total_steps),
              "set training.steps >= 1");
  TITAN_CHECK(warmup_steps >= 0 && warmup_steps <= total_steps,
              "LR warmup of " + std::to_string(warmup_steps) + " steps does not fit in " +
                  std::to_string(total_steps) + " training steps",
              "set lr_scheduler.warmup_steps in [0, training.steps]");
  TITAN_CHECK(min_lr_factor >= 0.0 && min_lr_factor <= 1.0,
              "min_lr_factor " + std::to_string(min_lr_factor) + " is outside [0, 1]",
              "set lr_scheduler.min_lr_factor in [0, 1]");
  if (decay_ratio) {
    TITAN_CHECK(*decay_ratio >= 0.0 && *decay_ratio <= 1.0,
                "decay_ratio " + std::to_string(*decay_ratio) + " is outside [0, 1]",
                "set lr_scheduler.decay_ratio in [0, 1], or leave it unset to decay right after warmup");
    // Python's round() rounds halves to even; nearbyint does too in the default rounding mode,
    // so the decay length matches TorchTitan's for ratios such as 0.25 of 10 steps.
    decay_steps_ = int64_t(std::nearbyint(double(total_steps) * *decay_ratio));
    // A decay that would overlap the warmup starts right after it instead (TorchTitan warns
    // and does the same); the ratio is a share of the run, not a promise of a length.
    if (warmup_steps + decay_steps_ > total_steps) decay_steps_ = total_steps - warmup_steps;
  } else {
    decay_steps_ = total_steps - warmup_steps;
  }
  stable_steps_ = total_steps + 1 - warmup_steps_ - decay_steps_;
}

double LrSchedule::lr_factor(int64_t step) const {
  TITAN_CHECK(step >= 1 && step <= total_steps_,
              "LR schedule asked for step " + std::to_string(step) + " of a " + std::to_string(total_steps_) +
                  "-step schedule",
              "steps are 1-based and end at training.steps; raise training.steps to train longer");
  const int64_t i = step - 1;
  if (i < warmup_steps_) return double(i + 1) / double(warmup_steps_);
  if (i < warmup_steps_ + stable_steps_) return 1.0;
  // Reaching here implies decay_steps_ >= 1: with no decay the stable phase covers every step.
  const double progress = double(i + 1 - warmup_steps_ - stable_steps_) / double(decay_steps_);
  double shape = 0.0;
  switch (decay_) {
    case LrDecay::linear: shape = 1.0 - progress; break;
    case LrDecay::sqrt: shape = 1.0 - std::sqrt(progress); break;
    case LrDecay::cosine: shape = 0.5 * (1.0 + std::cos(std::numbers::pi * progress)); break;
  }
  return min_lr_factor_ + (1.0 - min_lr_factor_) * shape;
}

}  // namespace titan::optim
