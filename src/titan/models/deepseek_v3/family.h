// DeepSeek-V3 and DeepSeek-V3.2 (an indexer in every layer) in the model registry
// (models/family.h): two names, one folder, one Hugging Face conversion.
#pragma once

#include "titan/models/family.h"

namespace titan::models::deepseek_v3 {

const ModelFamily& v3_family();
const ModelFamily& v32_family();

}  // namespace titan::models::deepseek_v3
