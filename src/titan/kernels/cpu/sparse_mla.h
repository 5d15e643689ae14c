// Fast sparse MLA attention pieces (per-ISA variants; see cpu/isa.h). kernels/sparse_mla.cpp
// runs them around oneDNN batched GEMMs, one chunk of consecutive query rows of one batch element
// at a time (dsa.md sections 4 and 5):
//   gather     rows[q, i, :] = kv[idx[q, i], :] (zero rows for invalid slots), bias[q, i] = 0 or -inf
//   GEMM       scores[q] = scale * Q[q] rows[q]^T                                     [H, K]
//   softmax    lse, P = exp(scores + bias - lse)
//   GEMM       O[q] = P[q] rows[q][:, :Dv]
// and in the backward, after the scores GEMM and dA[q] = dO[q] rows[q][:, :Dv]^T:
//   softmax_grad  P and dS = P * (dA - rowsum(dO * O))
//   GEMM       dQ[q] = scale * dS[q] rows[q]
//   dkv_accumulate  acc[part][idx[q, i], :] += scale * dS[q][:, i]^T Q[q] + P[q][:, i]^T dO[q] (first Dv),
//                   valid slots only, straight into the selected rows of a per-thread accumulator
//   dkv_reduce      dkv = sum over parts of acc, after the last chunk of a batch element
// q indexes the chunk's rows, which sit at query positions t0 + q. T is float or bf16; scores,
// dA, lse and the dkv accumulators are f32.
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
  void sparse_mla_softmax_grad(T* p, T* ds, const float* scores, const float* da, const float* bias,               \
                               const float* lse, const T* dout, const T* o, int64_t nq,                             \
                               const ::titan::kernels::SparseMlaDims& d);                                           \
  template <class T>                                                                                                \
  void sparse_mla_dkv_accumulate(float* acc, int64_t parts, const T* p, const T* ds, const T* q, const T* dout,     \
                                 const float* bias, const int32_t* idx, int64_t nq,                                 \
                                 const ::titan::kernels::SparseMlaDims& d);                                         \
  template <class T>                                                                                                \
  void sparse_mla_dkv_reduce(T* dkv, float* acc, int64_t parts, const ::titan::kernels::SparseMlaDims& d);          \
  int64_t sparse_mla_acc_width(int64_t dqk);
TITAN_FOR_EACH_ISA(TITAN_SPARSE_MLA_KERNELS)
