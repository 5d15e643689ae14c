// Fast token embedding lookup and gradient (per-ISA variants; see cpu/isa.h). Semantics as
// ref/embedding.h for T in {float, bf16}, f32 table. The backward takes the token rows grouped
// by id (kernels/row_buckets.h), so each table row is summed by one thread in token order.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/row_buckets.h"

#define TITAN_EMBEDDING_KERNELS                                                                       \
  template <class T>                                                                                  \
  void embedding_forward(T* y, const float* table, const int32_t* ids, int64_t n, int64_t d);         \
  template <class T>                                                                                  \
  void embedding_backward(float* dtable, const T* dy, const ::titan::kernels::RowBucketsView& by_id, int64_t d);
TITAN_FOR_EACH_ISA(TITAN_EMBEDDING_KERNELS)
