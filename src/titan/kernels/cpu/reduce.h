// Fast reductions and their backward (per-ISA variants; see cpu/isa.h). Semantics and shapes as
// in ref/reduce.h; T is float or bf16. Row sums accumulate in f32; whole-buffer reductions sum
// fixed blocks in f32 and the block sums in double, in block order, so their results are
// bit-identical for any thread count.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_REDUCE_KERNELS                                                                          \
  template <class T> void sum_rows(T* y, const T* x, int64_t N, int64_t D);                           \
  template <class T> void mean_rows(T* y, const T* x, int64_t N, int64_t D);                          \
  template <class T> void sum_rows_backward(T* dx, const T* dy, float scale, int64_t N, int64_t D);   \
  template <class T> void max_rows(T* y, int32_t* argmax, const T* x, int64_t N, int64_t D);          \
  template <class T>                                                                                  \
  void max_rows_backward(T* dx, const int32_t* argmax, const T* dy, int64_t N, int64_t D);            \
  template <class T> double sum_all(const T* x, int64_t n);                                           \
  template <class T> double sum_squares(const T* x, int64_t n);
TITAN_FOR_EACH_ISA(TITAN_REDUCE_KERNELS)
