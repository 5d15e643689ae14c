#include "titan/train/loss_scaler.h"

#include <algorithm>

#include "titan/core/error.h"

namespace titan::train {

void LossScaler::update(bool overflow) {
  if (overflow) {
    scale_ = std::max(scale_ * o_.backoff_factor, o_.min_scale);
    growth_tracker_ = 0;
    ++skipped_;
    return;
  }
  if (++growth_tracker_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    growth_tracker_ = 0;
  }
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}, {"skipped_steps", skipped_}};
}

void LossScaler::load(const nlohmann::json& state) {
  const double scale = state.at("scale").get<double>();
  TITAN_CHECK(scale > 0, "loss_scaler.scale = " + std::to_string(scale) + " in the checkpoint is not positive",
              "the checkpoint is damaged; load an earlier step");
  scale_ = scale;
  growth_tracker_ = state.at("growth_tracker").get<int64_t>();
  skipped_ = state.at("skipped_steps").get<int64_t>();
}

}  // namespace titan::train
