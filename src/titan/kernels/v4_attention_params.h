// The parameters of DeepSeek-V4's attention kernel (kernels/v4_attention.h), shared by the Tensor
// API, the reference twin and the fast CPU kernels, and which keys a query sees.
// Math: ../shared/reference/v4_transformers.md 3.3 (window), 3.4 and 3.6 (compressed entries, sink).
// Vocabulary of dimension names:
//   B batch, S queries, Skv raw key rows (Skv >= S: the queries are the LAST S of them, so query
//   t's own row is t + Skv - S; training on one rank has Skv == S, a context-parallel chunk
//   prepends the W - 1 rows before it), P0 the global position of query 0 (0 on one rank; a
//   chunk's start under context parallelism), H query heads, D head dim (the one shared K = V row
//   width), W sliding window, T compressed entries per sequence (T <= floor((P0 + S) / m); 0 on a
//   sliding-only layer), m the compress ratio, K the CSA slots per query (0: HCA, every visible
//   entry).
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dsa_params.h"

namespace titan::kernels {

struct V4AttentionParams {
  int64_t B = 0, S = 0;
  int64_t Skv = 0;    // raw key rows (>= S)
  int64_t P0 = 0;     // global position of query 0 (>= Skv - S): entries are counted from position 0
  int64_t H = 0, D = 0;
  int64_t W = 0;      // raw keys t - W < j <= t (W >= 1: a query always sees itself)
  int64_t T = 0;      // compressed entries
  int64_t ratio = 2;  // m >= 2: entry w pools raw positions w m .. w m + m - 1
  int64_t K = 0;      // CSA: slots per query in idx; 0: HCA
  double scale = 0;   // D^-0.5 in V4
};

// Which keys a query sees. Force-inlined: kernels/cpu/ code calls them from every ISA variant
// (see cpu/isa.h).

// Query t's own raw key row: the queries are the last S of the Skv rows.
TITAN_INLINE int64_t v4_self_row(const V4AttentionParams& d, int64_t t) { return t + d.Skv - d.S; }

// The first raw key row of query t's window: rows v4_window_start(d, t) .. v4_self_row(d, t).
TITAN_INLINE int64_t v4_window_start(const V4AttentionParams& d, int64_t t) {
  const int64_t first = v4_self_row(d, t) - d.W + 1;
  return first > 0 ? first : 0;
}

// Compressed entries 0 .. v4_visible_entries(d, t) - 1 are causally visible to query t: entry w
// once its last raw position is, w < floor((P0 + t + 1) / m) (the indexer's candidate rule, at
// the query's global position).
TITAN_INLINE int64_t v4_visible_entries(const V4AttentionParams& d, int64_t t) {
  return valid_keys(IndexerParams{.B = d.B, .S = d.S, .Skv = d.T, .ratio = d.ratio, .P0 = d.P0}, t);
}

// Whether CSA slot value s selects an entry for query t: a visible entry (-1 padding, future
// entries and entries >= T contribute nothing, as transformers drops them).
TITAN_INLINE bool v4_slot_valid(const V4AttentionParams& d, int32_t s, int64_t t) {
  return s >= 0 && int64_t(s) < v4_visible_entries(d, t);
}

}  // namespace titan::kernels
