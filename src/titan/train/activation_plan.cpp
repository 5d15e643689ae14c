#include "titan/train/activation_plan.h"

#include <algorithm>

#include "titan/core/error.h"

namespace titan::train {

ActivationModel activation_model(const models::ModelFamily& family, const models::PlanQuery& query) {
  ActivationModel m = family.activations(query);
  m.io = 3 * 4;  // inputs, targets and positions (i32)
  return m;
}

double activation_peak(const ActivationModel& m, const std::vector<int>& blocks, bool embedding, bool head,
                       models::Recompute mode) {
  double kept = m.io + (embedding ? m.embedding : 0), replay = 0;
  for (const int id : blocks) {
    const BlockActivations& b = m.blocks.at(size_t(id));
    switch (mode) {
      case models::Recompute::none: kept += b.held; break;
      case models::Recompute::full:
        kept += b.kept_full;
        replay = std::max(replay, b.replay_full - b.kept_full);
        break;
      case models::Recompute::selective:
        kept += b.kept_selective;
        replay = std::max(replay, b.replay_selective - b.kept_selective);
        break;
    }
  }
  return kept + std::max(head ? m.head : 0.0, replay);
}

double backward_temporaries(const ActivationModel& m, const std::vector<int>& blocks, bool head,
                            models::Recompute mode) {
  double most = head ? m.head_backward : 0;
  for (const int id : blocks) {
    const BlockActivations& b = m.blocks.at(size_t(id));
    // A replayed block's output gradient is copied into the replay (autograd/variable.cpp).
    most = std::max(most, b.backward + (mode == models::Recompute::none ? 0 : b.kept_full));
  }
  return most;
}

}  // namespace titan::train
