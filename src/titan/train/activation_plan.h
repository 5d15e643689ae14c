// What one token costs in activations and in the gradients of activations: the memory planner's
// (memory_plan.h) activation and temporaries terms, from each family's activation model
// (ModelFamily::activations, which lists every tensor a block keeps from forward to backward with
// the op that keeps it; the planner's test holds the sums to measured peaks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/models/family.h"
#include "titan/models/recompute.h"

namespace titan::train {

using models::ActivationModel;
using models::BlockActivations;

// The family's activation model of the query's job (ModelFamily::activations), with the inputs.
ActivationModel activation_model(const models::ModelFamily& family, const models::PlanQuery& query);

// Peak activation bytes per token of a stage holding `blocks` (ids), with or without the
// embedding and the head, under `mode`: every block's kept bytes, then at the peak either the
// head's (end of forward) or one block replayed in backward.
double activation_peak(const ActivationModel& m, const std::vector<int>& blocks, bool embedding, bool head,
                       models::Recompute mode);
// Temporaries' peak bytes per token: the loss's backward or a block's, whichever is larger.
double backward_temporaries(const ActivationModel& m, const std::vector<int>& blocks, bool head,
                            models::Recompute mode);

}  // namespace titan::train
