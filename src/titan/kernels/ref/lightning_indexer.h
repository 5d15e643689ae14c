// Reference: the DeepSeek Sparse Attention lightning indexer (docs/dsa.md sections 2, 3, 6), written
// as plain loops over one query row at a time. The oracle of the fast kernels in
// cpu/lightning_indexer.h; instantiated for double so gradient checks run in double.
//
// I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s]) over the valid keys of dsa_params.h
// (0 <= s <= t + Skv - S). Accumulation runs in acc_t<T>.
#pragma once

#include <cstdint>

#include "titan/kernels/dsa_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// Per row t: the min(K, valid) keys of highest I(t, .) in ascending key order, then -1 padding.
// Rank: NaN above +inf, -0 == +0, and equal scores rank the lower key first (deterministic).
template <class T>
void indexer_topk(int32_t* idx,         // [B, S, K]
                  const T* q,           // [B, S, HI, DI]
                  const T* k,           // [B, Skv, DI]
                  const acc_t<T>* w,    // [B, S, HI]
                  const IndexerParams& d);

// KL(p || softmax(I)) summed over all rows, with its gradient written (overwritten) into dq, dk
// and dw, scaled by grad_scale (semantics: lightning_indexer.h). idx == nullptr is the dense
// stage (every valid key); otherwise V_t is the set of valid entries of idx[t] (idx [B, S, d.K];
// invalid entries are skipped, a key listed twice counts once) and the target is recomputed from
// mq, mk and the sparse attention's mlse: the definition of docs/dsa.md 6.2, kept here as the oracle
// that indexer_kl_loss_sparse fed sparse_mla_forward's head_mean must match (the fast kernels
// and the Tensor API run the sparse stage only with the target given).
template <class T>
double indexer_kl_loss(T* dq,                 // [B, S, HI, DI]
                       T* dk,                 // [B, Skv, DI]
                       acc_t<T>* dw,          // [B, S, HI]
                       const T* q,            // [B, S, HI, DI]
                       const T* k,            // [B, Skv, DI]
                       const acc_t<T>* w,     // [B, S, HI]
                       const T* mq,           // [B, S, H, D]
                       const T* mk,           // [B, Skv, Hk, D]
                       const acc_t<T>* mlse,  // [B, S, H]
                       const int32_t* idx,    // [B, S, K] or nullptr
                       const IndexerParams& d, const IndexerTargetParams& td, double grad_scale);

// The sparse-stage loss with its target given per slot (target[t, i] for slot i of idx[t], e.g.
// sparse_mla_forward's head_mean): V_t = the valid entries of idx[t], a key listed twice counting
// once with the sum of its slots' targets; otherwise as indexer_kl_loss's sparse stage.
template <class T>
double indexer_kl_loss_sparse(T* dq,                   // [B, S, HI, DI]
                              T* dk,                   // [B, Skv, DI]
                              acc_t<T>* dw,            // [B, S, HI]
                              const T* q,              // [B, S, HI, DI]
                              const T* k,              // [B, Skv, DI]
                              const acc_t<T>* w,       // [B, S, HI]
                              const int32_t* idx,      // [B, S, K]
                              const acc_t<T>* target,  // [B, S, K]
                              const IndexerParams& d, double grad_scale);

// x[r] <- x[r] H / sqrt(n) for each of `rows` rows of n (a power of two) values, H the Sylvester
// Hadamard matrix H[i][j] = (-1)^popcount(i & j), as a plain matrix product.
template <class T>
void hadamard_transform(T* x, int64_t rows, int64_t n);

}  // namespace titan::kernels::ref
