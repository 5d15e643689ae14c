// DeepSeek-V4's context-parallel traffic (Attention::cp; torchtitan-npu's scheme): what one rank
// receives per layer in the forward's all-gathers. The backward reduce-scatters the gradients of
// the same rows (the indexer's only while it trains), so it moves the same bytes again.
#pragma once

#include <cstdint>

#include "titan/models/deepseek_v4/args.h"

namespace titan::models::deepseek_v4 {

struct CpLayerTraffic {
  double window = 0;   // every layer: the W - 1 raw key rows before each of a rank's two chunks
  double entries = 0;  // CSA / HCA: every rank's compressed entries; CSA: the m overlap rows' projections
  double indexer = 0;  // CSA: the indexer's keys (compressed entries of width dI) and overlap rows
  double total() const { return window + entries + indexer; }
};

// Bytes one rank of cp receives for one layer of type t, for `batch` sequences of seq_len tokens
// with elements of elem_bytes (f32: 4). Each all-gather brings the other cp - 1 ranks' share.
CpLayerTraffic context_parallel_layer_traffic(const DeepSeekV4Args& a, LayerType t, int64_t batch, int64_t seq_len,
                                              int64_t cp, int64_t elem_bytes);

}  // namespace titan::models::deepseek_v4
