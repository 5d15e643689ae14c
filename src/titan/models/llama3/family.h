// Llama-3's entry in the model registry (models/family.h).
#pragma once

#include "titan/models/family.h"

namespace titan::models::llama3 {

const ModelFamily& family();

}  // namespace titan::models::llama3
