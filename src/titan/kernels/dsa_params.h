// The parameters (sizes and scales) of the DeepSeek Sparse Attention kernels (lightning indexer,
// sparse MLA attention and the indexer's KL loss), one struct per kernel family, shared by the
// Tensor API, the reference twins and the fast CPU kernels.
// Math: docs/dsa.md sections 2-6. Vocabulary of dimension names:
//   B batch, S query positions, Skv key positions (the queries are the LAST S of the Skv
//   positions, so query t sits at key position t + Skv - S; training has Skv == S),
//   H main attention heads, Hk main key heads (1 = the absorbed MQA form, H = standard MLA),
//   Dqk / Dv main query-key and value widths, HI / DI indexer heads and head dim, K = top-k.
#pragma once

#include <cstdint>

namespace titan::kernels {

// Key s is a valid candidate for query t when 0 <= s <= t + (Skv - S) (causal). A selected index
// idx[b, t, i] is valid when it is a valid candidate; anything else (-1 padding, >= Skv, a
// future key) contributes nothing.
//
// With ratio m > 1 the keys are compressed entries (DeepSeek-V4's CSA: entry s pools raw
// positions s m .. s m + m - 1) and the queries sit at positions P0 .. P0 + S - 1 (P0 = 0 on
// one rank; a chunk's first position under context parallelism, with the entries of the whole
// sequence before it): key s is valid for query t once its last position is,
// s < floor((P0 + t + 1) / m); early queries may have none.
struct IndexerParams {
  int64_t B = 0, S = 0, Skv = 0;
  int64_t HI = 0, DI = 0;
  int64_t K = 0;      // slots per query row in idx
  int64_t ratio = 1;  // raw positions per key
  int64_t P0 = 0;     // ratio > 1: the global position of query 0
};

// The number of valid keys of query t: keys 0 .. valid_keys(d, t) - 1.
inline int64_t valid_keys(const IndexerParams& d, int64_t t) {
  const int64_t n = d.ratio > 1 ? (d.P0 + t + 1) / d.ratio : t + d.Skv - d.S + 1;
  return n < 0 ? 0 : n < d.Skv ? n : d.Skv;
}

struct SparseMlaParams {
  int64_t B = 0, S = 0, Skv = 0;
  int64_t H = 0;
  int64_t Dqk = 0;  // key width: all Dqk dims of a latent row (576 at full scale)
  int64_t Dv = 0;   // value = the first Dv dims of the same row (512); Dv <= Dqk
  int64_t K = 0;
  double scale = 0;  // softmax scale tau (MLA keeps d_qk(MHA)^-0.5 * mscale^2; not Dqk^-0.5)
};

// The main attention whose head-averaged probabilities are the indexer's KL target.
struct IndexerTargetParams {
  int64_t H = 0, Hk = 0, D = 0;  // query heads, key heads (1 or H), query-key width
  double scale = 0;
};

}  // namespace titan::kernels
