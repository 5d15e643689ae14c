#include "titan/models/deepseek_v4/plan.h"

namespace titan::models::deepseek_v4 {

CpLayerTraffic context_parallel_layer_traffic(const DeepSeekV4Args& a, LayerType t, int64_t batch, int64_t seq_len,
                                              int64_t cp, int64_t elem_bytes, int64_t rank) {
  const double b = double(batch) * double(elem_bytes), len = double(seq_len) / double(2 * cp);
  const double hd = double(a.head_dim), di = double(a.index_head_dim);
  const int64_t m = a.compress_ratio(t);
  CpLayerTraffic x;
  // Rank r borrows from rank r - 1 (r > 0) and from rank r + 1 (r < cp - 1).
  x.chunks_from_others = rank < 0 ? int(cp > 2 ? 2 : cp - 1) : int(rank > 0) + int(rank < cp - 1);
  x.before = b * double(a.sliding_window - 1) * hd;  // the kv rows
  // CSA's overlap: the kv and gate projections (each 2 x width wide) of the m tokens before a chunk.
  if (t == LayerType::csa) x.before += b * double(m) * 2 * (2 * hd + 2 * di);
  if (m == 0) return x;
  const double others = double(cp - 1) * b;  // an all-gather brings the other ranks' two chunks
  x.entries = others * 2 * len / double(m) * hd;
  if (t == LayerType::csa) x.indexer = others * 2 * len / double(m) * di;
  return x;
}

}  // namespace titan::models::deepseek_v4
