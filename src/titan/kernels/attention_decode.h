// Causal attention of new queries against a key/value cache, for generation (inference only).
#pragma once

#include <optional>

#include "titan/core/tensor.h"

namespace titan::kernels {

// q [B, T, H, Dqk] holds the queries of positions past, ..., past + T - 1; k [B, >= past + T, Hkv, Dqk]
// and v [B, >= past + T, Hkv, Dv] hold the cache, whose first past + T rows are valid. Query i
// attends to keys [0, past + i]. o [B, T, H, Dv]. All f32, contiguous. Row i equals row past + i
// of attention_forward over the whole sequence (tested), so prefill and decode agree.
void attention_decode(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, int64_t past,
                      std::optional<double> scale = std::nullopt);

}  // namespace titan::kernels
