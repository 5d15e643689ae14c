// Tensor-level DeepSeek Sparse Attention indexer kernels: fused score + streaming top-k, and the
// indexer's KL loss fused with its gradient (torchtitan-npu's SparseLightningIndexerGradKLLoss).
// Dispatches to the fast CPU kernels or, under TITAN_KERNELS=reference, to the reference twins.
// Math: docs/dsa.md sections 2, 3 and 6; sizes and the validity rule: dsa_params.h.
//
// Index score of query t and key s (valid s only):  I(t, s) = sum_j w[t, j] * ReLU(q[t, j] . k[s])
// w already holds the H_I^-0.5 * d_I^-0.5 scaling (the caller multiplies weights_proj's output).
#pragma once

#include "titan/core/tensor.h"

namespace titan::kernels {

// idx [B, S, K] i32 = the K valid keys of highest I(t, .) per query, never forming the S x Skv
// score matrix. Rows with fewer than K valid keys select all of them. Each row lists its
// selection in ascending key order, then -1 padding. Ties rank the lower key index first, so
// the result is deterministic.
// q [B, S, HI, DI], k [B, Skv, DI] (f32 or bf16, same dtype), w [B, S, HI] f32.
// ratio > 1: k holds compressed entries of `ratio` raw positions each (DeepSeek-V4's CSA) and
// query t, at global position pos0 + t (pos0: a context-parallel chunk's start, else 0), sees
// entries s < floor((pos0 + t + 1) / ratio) (dsa_params.h); a row with none is all -1.
void indexer_topk(Tensor& idx, const Tensor& q, const Tensor& k, const Tensor& w, int64_t ratio = 1, int64_t pos0 = 0);

// The indexer's KL loss and its gradients, in one pass over the keys of each query block.
// Loss row t: KL(p[t] || softmax_{V_t}(I[t])) with 0 log 0 = 0 over a valid set V_t; rows with
// empty V_t add nothing. Returns the sum of the rows' KL over all B * S rows (a double).
// Writes (overwrites) dq [B, S, HI, DI], dk [B, Skv, DI] (q's dtype) and dw [B, S, HI] f32 with
// the gradient of grad_scale * (that sum): g(t, s) = grad_scale * (softmax(I[t])_s - p[t, s]),
// dw[t, j] = sum_s g R_j, dq[t, j] = sum_s g w[t, j] 1[q.k > 0] k[s], dk[s] = sum_t,j likewise
// (dk summed over queries without races). p is detached.

// Dense warm-up stage: V_t = every valid key, and the target (the head mean of the main
// attention's probabilities) is recomputed from the main queries, keys and lse:
// p[t, s] = (1/H) sum_h exp(scale * mq[t, h] . mk[s, h / (H / Hk)] - mlse[t, h]).
// mq [B, S, H, D], mk [B, Skv, Hk, D] (q's dtype), mlse [B, S, H] f32 (natural log).
double indexer_kl_loss(Tensor& dq, Tensor& dk, Tensor& dw, const Tensor& q, const Tensor& k, const Tensor& w,
                       const Tensor& mq, const Tensor& mk, const Tensor& mlse, double scale, double grad_scale);

// Sparse stage: V_t = the valid entries of idx[t] (dsa_params.h), with the target given per slot:
// target [B, S, K] f32, aligned with idx (sparse_mla_forward's head_mean, docs/dsa.md 6.2). A key listed
// twice counts once, with the sum of its slots' targets (top-k never lists one twice).
double indexer_kl_loss_sparse(Tensor& dq, Tensor& dk, Tensor& dw, const Tensor& q, const Tensor& k, const Tensor& w,
                              const Tensor& idx, const Tensor& target, double grad_scale, int64_t ratio = 1,
                              int64_t pos0 = 0);

// In place y = x H / sqrt(n) on each row of the last dim n (a power of two), H the Sylvester
// Hadamard matrix: the indexer's rotate_activation. Orthonormal and symmetric, so it is its own
// inverse and its own backward. f32 or bf16 (computed in f32).
void hadamard_transform(Tensor& x);

}  // namespace titan::kernels
