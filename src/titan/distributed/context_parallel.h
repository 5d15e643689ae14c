// Context parallelism: a micro-batch's sequences split over the cp ranks of a group, with
// PyTorch's / TorchTitan's head-tail load balance: the S positions are cut into 2c chunks of
// S / 2c, and rank r holds chunks r and 2c-1-r (one early, one late chunk, so causal attention
// costs every rank the same). Token-wise layers run on the local chunks as they are; attention
// is the one place that needs other ranks' keys.
//
// DeepSeek Sparse Attention under CP (torchtitan-npu's design, reference/distributed.md section
// 5): queries stay local; the absorbed latent rows ([c | k_rope], d_c + d_r wide) and the
// indexer keys are all-gathered along the sequence (gather_sequence; backward: the gradients
// reduce-scattered home), and each local chunk's queries run the DSA kernels against the
// gathered causal prefix that ends with them (the kernels' "queries are the last S of Skv"
// rule). Exact: a query's top-k, output and KL term depend only on keys up to its position.
#pragma once

#include <array>
#include <utility>

#include "titan/autograd/variable.h"
#include "titan/distributed/process_group.h"

namespace titan::distributed {

using autograd::Variable;

// One rank's share of the sequence.
struct CpLayout {
  int degree = 1, rank = 0;
  int64_t seq_len = 0;  // S, the whole sequence
  int64_t chunk() const { return seq_len / (2 * degree); }
  int64_t local_len() const { return 2 * chunk(); }
  // The global chunk held as local chunk j (0: the early one, r; 1: the late one, 2c-1-r).
  int64_t global_chunk(int j) const { return j == 0 ? rank : 2 * degree - 1 - rank; }
  // First global position of local chunk j.
  int64_t chunk_start(int j) const { return global_chunk(j) * chunk(); }
};

// The layout of `cp` for sequences of seq_len. Throws, naming the values that would work, when
// seq_len does not split into 2 x degree chunks.
CpLayout cp_layout(const ProcessGroup& cp, int64_t seq_len);

// The local chunks of per-token values: x [B, S, ...] (tokens, targets, ...; any dtype) ->
// [B, 2 S/2c, ...].
Tensor local_chunks(const Tensor& x, const CpLayout& layout);
// The global positions of the local tokens, i32 [B, 2 S/2c].
Tensor local_positions(int64_t batch, const CpLayout& layout);

// A loss that is the mean over this rank's valid targets (local_targets: the targets of its
// chunks, -100 ignored), rescaled by its share of the valid targets over the cp ranks, so that
// their losses and gradients sum to the mean over the whole sequences; with that mean (the same
// on every rank; 0 when no target is valid). Blocks on one host all-reduce over cp.
std::pair<Variable, double> mean_over_sequences(const Variable& local_mean, const Tensor& local_targets,
                                                const ProcessGroup& cp);

// x [B, 2 S/2c, ...] (this rank's chunks) -> [B, S, ...] in natural order (every rank's chunks in
// place): an all-gather. Backward: the gradient reduce-scattered back to each rank's chunks.
Variable gather_sequence(const Variable& x, const ProcessGroup& cp, const CpLayout& layout);

// For each local chunk j, the n rows of the sequence just before its first position: the last n
// rows of the global chunk before it, whichever rank holds that one. x [B, 2 S/2c, ...] (this
// rank's chunks) -> {[B, n, ...] before chunk 0, [B, n, ...] before chunk 1}; undefined for the
// sequence's first chunk. DeepSeek-V4's attention prepends them (its window's raw keys, CSA's
// overlapping window). Under the head-tail layout those come from the neighbouring ranks: rank r
// receives chunk r - 1's last rows from rank r - 1 and chunk 2c-2-r's from rank r + 1 (rank
// c - 1 holds both chunks c - 1 and c), so a rank sends and receives at most 2 n rows whatever c
// (an all-gather of every chunk's last rows would bring (c - 1) 2 n). Backward: the gradients
// sent back the same way and added to the rows. n <= S/2c.
std::array<Variable, 2> preceding_rows(const Variable& x, int64_t n, const ProcessGroup& cp, const CpLayout& layout);

// Rows [start, start + len) of dim 1 of x [B, L, ...], as a contiguous [B, len, ...]. Backward:
// the gradient added into those rows.
Variable narrow_sequence(const Variable& x, int64_t start, int64_t len);
// [B, La, ...] and [B, Lb, ...] -> [B, La + Lb, ...] (dim 1). Backward: the two parts.
Variable concat_sequence(const Variable& a, const Variable& b);

}  // namespace titan::distributed
