#include "titan/models/deepseek_v4/plan.h"

namespace titan::models::deepseek_v4 {

CpLayerTraffic context_parallel_layer_traffic(const DeepSeekV4Args& a, LayerType t, int64_t batch, int64_t seq_len,
                                              int64_t cp, int64_t elem_bytes) {
  // A rank's contribution to each all-gather, in rows of its width; the other cp - 1 ranks'
  // arrive. Two chunks of L tokens per rank.
  const double others = double(cp - 1) * double(batch) * double(elem_bytes), len = double(seq_len) / double(2 * cp);
  const double hd = double(a.head_dim), di = double(a.index_head_dim);
  CpLayerTraffic x;
  x.window = others * 2 * double(a.sliding_window - 1) * hd;  // distributed::preceding_rows of kv
  const int64_t m = a.compress_ratio(t);
  if (m == 0) return x;
  // CSA's overlap: the kv and gate projections (2 width wide each) of the m tokens before a chunk.
  const auto overlap = [&](double width) { return t == LayerType::csa ? others * 2 * double(m) * 2 * (2 * width) : 0.0; };
  x.entries = others * 2 * len / double(m) * hd + overlap(hd);
  if (t == LayerType::csa) x.indexer = others * 2 * len / double(m) * di + overlap(di);
  return x;
}

}  // namespace titan::models::deepseek_v4
