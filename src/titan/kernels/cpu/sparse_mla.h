// Fast sparse MLA attention pieces (per-ISA variants; see cpu/isa.h). kernels/sparse_mla.cpp
// runs them around oneDNN batched GEMMs, one chunk of consecutive query rows of one batch element
// at a time (dsa.md sections 4 and 5):
//   gather     rows[q, i, :] = kv[idx[q, i], :] (zero rows for invalid slots), bias[q, i] = 0 or -inf
//   GEMM       scores[q] = scale * Q[q] rows[q]^T                                     [H, K]
//   softmax    lse, P = exp(scores + bias - lse)
//   GEMM       O[q] = P[q] rows[q][:, :Dv]
// and in the backward, after the scores GEMM and dA[q] = dO[q] rows[q][:, :Dv]^T:
//   softmax_grad  P and dS = P * (dA - rowsum(dO * O))
//   GEMMs      dQ[q] = scale * dS[q] rows[q], drows[q] = scale * dS[q]^T Q[q] + P[q]^T dO[q] (first Dv)
//   scatter_add   acc[idx[q, i], :] += drows[q, i, :] over valid slots
// q indexes the chunk's rows, which sit at query positions t0 + q. T is float or bf16; scores,
// dA, lse and the dkv accumulator are f32.
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
  void sparse_mla_scatter_add(float* acc, const float* drows, const float* bias, const int32_t* idx, int64_t nq,   \
                              const ::titan::kernels::SparseMlaDims& d);                                            \
  template <class T>                                                                                                \
  void sparse_mla_store(T* dst, const float* src, int64_t n);
TITAN_FOR_EACH_ISA(TITAN_SPARSE_MLA_KERNELS)
