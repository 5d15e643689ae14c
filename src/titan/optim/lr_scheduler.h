// Learning-rate schedule: linear warmup, a stable plateau, then a decay (warmup-stable-decay,
// "WSD", arXiv 2404.06395), laid out exactly as TorchTitan lays it out so that a run ported
// from TorchTitan sees the same learning rate at every step.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>

#include "titan/core/enum_names.h"

namespace titan::optim {

enum class LrDecay { linear, sqrt, cosine };

// The names [lr_scheduler] decay_type accepts.
inline constexpr std::array<EnumName<LrDecay>, 3> kLrDecayNames = {{
    {LrDecay::linear, "linear"},
    {LrDecay::sqrt, "sqrt"},
    {LrDecay::cosine, "cosine"},
}};
constexpr std::span<const EnumName<LrDecay>> enum_names(LrDecay) { return kLrDecayNames; }

// The multiplier applied to the peak learning rate at each optimizer step.
//
// With S total steps, W warmup steps and decay_ratio r:
//   decay D = round-half-even(S * r), cut to S - W when W + D > S; without r, D = S - W;
//   stable = S + 1 - W - D. The "+ 1" is TorchTitan's virtual last step: the final real step
//   still trains with a factor above min_lr_factor (the factor reaches it one step later).
// Step s (1-based) uses i = s - 1:
//   i < W              (i + 1) / W                                  warmup, ends at 1.0
//   i < W + stable     1.0
//   otherwise          p = (i + 1 - W - stable) / D, then
//                      min + (1 - min) * {1 - p | 1 - sqrt(p) | (1 + cos(pi p)) / 2}
// The factor depends on the step alone, so a resumed run only needs its step number.
class LrSchedule {
 public:
  LrSchedule(int64_t total_steps, int64_t warmup_steps, std::optional<double> decay_ratio, LrDecay decay,
             double min_lr_factor);

  // step: the 1-based number of the optimizer step about to run (the step that logs and
  // checkpoint folders name), in [1, total_steps].
  double lr_factor(int64_t step) const;

  int64_t total_steps() const { return total_steps_; }
  int64_t warmup_steps() const { return warmup_steps_; }
  int64_t stable_steps() const { return stable_steps_; }
  int64_t decay_steps() const { return decay_steps_; }

 private:
  int64_t total_steps_;
  int64_t warmup_steps_;
  int64_t stable_steps_;
  int64_t decay_steps_;
  LrDecay decay_;
  double min_lr_factor_;
};

}  // namespace titan::optim
