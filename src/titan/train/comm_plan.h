// The bytes each collective sends per optimizer step from one rank, the analytic minimum of the
// parallel plans (the project's reference notes on distributed training, section 9): the
// planner's traffic (memory_plan.h), and what bench/bench_distributed.cpp compares measured
// traffic with.
#pragma once

#include <vector>

#include "titan/train/memory_plan.h"
#include "titan/train/plan_layout.h"

namespace titan::train::plan {

// `params`: the rank's parameters; `part`: its pipeline stages.
std::vector<PlanCollective> plan_traffic(const PlanJob& j, const std::vector<Local>& params, const StagePart& part);

}  // namespace titan::train::plan
