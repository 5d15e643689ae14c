// The memory planner's questions about a DeepSeek-V3 / V3.2 architecture (models/family.h).
#pragma once

#include <cstdint>
#include <vector>

#include "titan/models/deepseek_v3/args.h"
#include "titan/models/family.h"

namespace titan::models::deepseek_v3 {

ActivationModel activation_model(const DeepSeekV3Args& a, const PlanQuery& q);
std::vector<int64_t> experts_per_token(const DeepSeekV3Args& a, const PlanQuery& q);
std::vector<ContextParallelTraffic> context_parallel_traffic(const DeepSeekV3Args& a, const PlanQuery& q);

}  // namespace titan::models::deepseek_v3
