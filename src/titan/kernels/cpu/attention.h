// Fast causal flash attention (GQA, separate value width), forward and backward, per-ISA variants
// (see cpu/isa.h). Same contract as ref/attention.h with T in {float, bf16} and f32 lse.
#pragma once

#include "titan/core/dtype.h"
#include "titan/kernels/attention_dims.h"
#include "titan/kernels/dispatch.h"

#define TITAN_ATTENTION_KERNELS                                                                               \
  template <class T>                                                                                          \
  void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v,                                \
                         const ::titan::kernels::AttentionDims& d);                                           \
  template <class T>                                                                                          \
  void attention_backward(T* dq, T* dk, T* dv, const float* lse, const T* dout, const T* q, const T* k,       \
                          const T* v, const T* o, const ::titan::kernels::AttentionDims& d);
TITAN_FOR_EACH_ISA(TITAN_ATTENTION_KERNELS)
