// DeepSeek-V4's entry in the model registry (models/family.h).
#pragma once

#include "titan/models/family.h"

namespace titan::models::deepseek_v4 {

const ModelFamily& family();

}  // namespace titan::models::deepseek_v4
