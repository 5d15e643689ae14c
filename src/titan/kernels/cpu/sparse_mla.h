// Fast sparse MLA attention kernels (per-ISA variants; see cpu/isa.h); dsa.md sections 4 and 5.
// Two paths, one per precision (kernels/sparse_mla.cpp picks, and says why):
//
// Fused (f32): sparse_mla_forward / sparse_mla_backward. OpenMP over queries; each thread copies
// its query's valid selected rows once into an L2-sized f32 buffer, and every head reuses them
// in register-tiled products: scores^T [n, H] = rows x (scale q)^T, softmax across slots per head,
// o = P^T rows[:, :Dv]; backward [scores | dA] = rows x (scale q | dO)^T in one product,
// dq = scale dS^T rows, and the dkv rows of the selected keys += (scale dS | P) (q ; dO), added in
// place into a per-thread f32 accumulator [parts, Skv, acc_width] that is summed into dkv per
// batch element (no atomics). `acc` must be zero and is left zero.
//
// Staged (bf16): the stages below run around oneDNN batched GEMMs (AMX), one chunk of
// consecutive query rows of one batch element at a time:
//   gather     rows[q, i, :] = kv[idx[q, i], :] (zero rows for invalid slots), bias[q, i] = 0 or -inf
//   GEMM       scores[q] = scale * Q[q] rows[q]^T                                     [H, K]
//   softmax    lse, P = exp(scores + bias - lse)
//   GEMM       O[q] = P[q] rows[q][:, :Dv]
// and in the backward, after the scores GEMM and dA[q] = dO[q] rows[q][:, :Dv]^T:
//   softmax_grad  P and dS = P * (dA - rowsum(dO * O)), in place of the scores and dA (f32, for
//                 dkv) and dS once more in T (the GEMM operand)
//   GEMM       dQ[q] = scale * dS[q] rows[q]
//   dkv_accumulate  acc[part][idx[q, i], :] += scale * dS[q][:, i]^T Q[q] + P[q][:, i]^T dO[q] (first Dv),
//                   valid slots only, straight into the selected rows of a per-thread accumulator
//   dkv_reduce      dkv = sum over parts of acc, after the last chunk of a batch element
// q indexes the chunk's rows, which sit at query positions t0 + q. Scores, dA, lse and the dkv
// accumulators are f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/dsa_dims.h"

#define TITAN_SPARSE_MLA_KERNELS                                                                                    \
  template <class T>                                                                                                \
  void sparse_mla_gather(T* rows, float* bias, const T* kv, const int32_t* idx, int64_t t0, int64_t nq,             \
                         const ::titan::kernels::SparseMlaDims& d);                                                 \
  template <class T>                                                                                                \
  void sparse_mla_softmax(T* p, float* lse, const float* scores, const float* bias, int64_t nq,                     \
                          const ::titan::kernels::SparseMlaDims& d);                                                \
  template <class T>                                                                                                \
  void sparse_mla_softmax_grad(T* ds, float* scores_p, float* da_ds, const float* bias, const float* lse,         \
                               const T* dout, const T* o, int64_t nq, const ::titan::kernels::SparseMlaDims& d);    \
  template <class T>                                                                                                \
  void sparse_mla_dkv_accumulate(float* acc, int64_t parts, const float* p, const float* ds, const T* q,            \
                                 const T* dout,                                                                     \
                                 const float* bias, const int32_t* idx, int64_t nq,                                 \
                                 const ::titan::kernels::SparseMlaDims& d);                                         \
  template <class T>                                                                                                \
  void sparse_mla_dkv_reduce(T* dkv, float* acc, int64_t parts, const ::titan::kernels::SparseMlaDims& d);          \
  int64_t sparse_mla_acc_width(int64_t dqk);                                                                        \
  template <class T>                                                                                                \
  void sparse_mla_forward(T* o, float* lse, const T* q, const T* kv, const int32_t* idx,                            \
                          const ::titan::kernels::SparseMlaDims& d);                                                \
  template <class T>                                                                                                \
  void sparse_mla_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,   \
                           const float* lse, float* acc, int64_t parts, const ::titan::kernels::SparseMlaDims& d);
TITAN_FOR_EACH_ISA(TITAN_SPARSE_MLA_KERNELS)
