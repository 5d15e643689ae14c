// Hash routing (DeepSeek-V4's hash_moe layers, transformers' DeepseekV4TopKRouter with tid2eid):
// a token's K experts are a frozen table's row at its token id, not a top-k of its scores; an
// expert may repeat within a row. The router's scores still weight the chosen experts.
#pragma once

#include <cstdint>

#include "titan/core/tensor.h"

namespace titan::models::moe {

// The experts [T, K] i32 of T tokens: rows token_ids [T] (contiguous i32) of tid2eid [V, K] i64.
// Throws, naming the fix, when the ids are missing or out of range or an entry is not an expert
// of the E.
Tensor hash_choice(const Tensor& tid2eid, const Tensor& token_ids, int64_t tokens, int64_t experts);

}  // namespace titan::models::moe
