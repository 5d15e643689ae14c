// Fast lightning indexer kernels (per-ISA variants; see cpu/isa.h): fused score + streaming
// top-k, the KL loss fused with its gradient (dense stage: target recomputed from the main
// attention; sparse stage: target given per slot), and the Hadamard transform. Same contract as
// ref/lightning_indexer.h for T in {float, bf16}, with f32 weights and statistics (the dense
// loss is ref's indexer_kl_loss with idx == nullptr).
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/dsa_params.h"

#define TITAN_LIGHTNING_INDEXER_KERNELS                                                                              \
  template <class T>                                                                                                 \
  void indexer_topk(int32_t* idx, const T* q, const T* k, const float* w, const ::titan::kernels::IndexerParams& d); \
  template <class T>                                                                                                 \
  double indexer_kl_loss(T* dq, T* dk, float* dw, const T* q, const T* k, const float* w, const T* mq, const T* mk,  \
                         const float* mlse, const ::titan::kernels::IndexerParams& d,                                \
                         const ::titan::kernels::IndexerTargetParams& td, double grad_scale);                        \
  template <class T>                                                                                                 \
  double indexer_kl_loss_sparse(T* dq, T* dk, float* dw, const T* q, const T* k, const float* w,                     \
                                const int32_t* idx, const float* target, const ::titan::kernels::IndexerParams& d,   \
                                double grad_scale);                                                                  \
  template <class T>                                                                                                 \
  void hadamard_transform(T* x, int64_t rows, int64_t n);
TITAN_FOR_EACH_ISA(TITAN_LIGHTNING_INDEXER_KERNELS)
