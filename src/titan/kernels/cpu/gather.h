// Fast row gather and scatter-add with optional per-row weights (per-ISA variants; see
// cpu/isa.h). Semantics as ref/gather.h, for T in {float, bf16}; weights and their gradients f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/row_buckets.h"

#define TITAN_GATHER_KERNELS                                                                             \
  template <class T>                                                                                     \
  void gather_rows_forward(T* y, const T* x, const int32_t* idx, const float* w, int64_t m, int64_t d);   \
  template <class T>                                                                                     \
  void gather_rows_backward(T* dx, float* dw, const T* dy, const T* x, const int32_t* idx, const float* w, \
                            const ::titan::kernels::RowBucketsView& buckets, int64_t m, int64_t d);      \
  template <class T>                                                                                     \
  void scatter_add_rows_forward(T* y, const T* x, const float* w, const ::titan::kernels::RowBucketsView& buckets, \
                                int64_t d);                                                              \
  template <class T>                                                                                     \
  void scatter_add_rows_backward(T* dx, float* dw, const T* dy, const T* x, const int32_t* idx, const float* w, \
                                 int64_t m, int64_t d);
TITAN_FOR_EACH_ISA(TITAN_GATHER_KERNELS)
