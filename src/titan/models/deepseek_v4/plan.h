// DeepSeek-V4's context-parallel traffic (Attention::cp; torchtitan-npu's scheme): what one rank
// receives per layer in the forward. The backward sends the gradients of the same rows back the
// same way (the indexer's only while it trains), so it moves the same bytes again.
#pragma once

#include <cstdint>

#include "titan/models/deepseek_v4/args.h"

namespace titan::models::deepseek_v4 {

struct CpLayerTraffic {
  // Point-to-point (distributed::preceding_rows), per chunk whose rows before it another rank
  // holds: the window's W - 1 raw key rows and, CSA, the m overlap tokens' compressor projections
  // (the attention's and the indexer's).
  double before = 0;
  int chunks_from_others = 0;  // of this rank's two chunks; the busiest rank: 2 (1 when cp = 2)
  // All-gathers: every rank's compressed entries (CSA / HCA) and CSA's indexer keys.
  double entries = 0, indexer = 0;
  double sent_point_to_point() const { return chunks_from_others * before; }
  double total() const { return sent_point_to_point() + entries + indexer; }
};

// Bytes rank `rank` of cp (-1: the busiest rank) receives for one layer of type t, for `batch`
// sequences of seq_len tokens with elements of elem_bytes (f32: 4). Each all-gather brings the
// other cp - 1 ranks' share; a rank sends as many point-to-point bytes as it receives.
CpLayerTraffic context_parallel_layer_traffic(const DeepSeekV4Args& a, LayerType t, int64_t batch, int64_t seq_len,
                                              int64_t cp, int64_t elem_bytes, int64_t rank = -1);

}  // namespace titan::models::deepseek_v4
