// Fast element-wise ops and their backward (per-ISA variants; see cpu/isa.h). Semantics,
// aliasing and null-gradient rules as in ref/elementwise.h; T is float or bf16, math in f32.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_ELEMENTWISE_KERNELS                                                                   \
  template <class T> void add(T* y, const T* a, const T* b, float alpha, int64_t n);                \
  template <class T> void add_backward(T* da, T* db, const T* dy, float alpha, int64_t n);          \
  template <class T> void mul(T* y, const T* a, const T* b, int64_t n);                             \
  template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n); \
  template <class T> void scale(T* y, const T* x, float alpha, int64_t n);                          \
  template <class T> void axpby(T* y, const T* x, float alpha, float beta, int64_t n);
TITAN_FOR_EACH_ISA(TITAN_ELEMENTWISE_KERNELS)
