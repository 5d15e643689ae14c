// Reference: mHC's Sinkhorn projection (DeepSeek-V4's residual mixing matrix; transformers'
// DeepseekV4 HyperConnection, ../shared/reference/v4_transformers.md section 2.1). Per token, an
// N x N matrix of logits L becomes a nearly doubly stochastic P:
//
//   P = rowsoftmax(L) + eps
//   P[j, k] /= sum_j P[j, k] + eps                      columns first
//   then iters - 1 times:  rows  P[j, k] /= sum_k P[j, k] + eps,  then the columns again
//
// iters column and iters - 1 row normalisations; it ends on a column step. Backward is unrolled
// autodiff in reverse: a step Y = Z / (s + eps) with s the axis sum gives
// dZ = (dY - sum_axis dY * Y) / (s + eps) along that axis; the + eps passes the gradient; the
// softmax dL = Q * (dQ - sum_k dQ * Q) per row. The reference saves every step of a token.
#pragma once

#include <cstdint>

namespace titan::kernels::ref {

// p, logits: [tokens, N, N] row-major (j the row, k the column)
template <class T>
void sinkhorn_forward(T* p, const T* logits, int64_t tokens, int64_t n, int iters, double eps);
// dlogits += dL of <dp, P(logits)> (the forward recomputed from logits)
template <class T>
void sinkhorn_backward(T* dlogits, const T* dp, const T* logits, int64_t tokens, int64_t n, int iters, double eps);

}  // namespace titan::kernels::ref
