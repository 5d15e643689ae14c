// Fast causal flash attention (GQA, separate value width), forward and backward, per-ISA variants
// (see cpu/isa.h). Same contract as ref/attention.h with T in {float, bf16} and f32 lse. bf16 with
// AMX (the avx512_bf16 variant when cpu_amx_bf16_usable(), Dqk and Dv multiples of 32) runs its
// products on tiles, with P and dS rounded to bf16 as operands (see kernels/attention.h).
#pragma once

#include "titan/core/dtype.h"
#include "titan/kernels/attention_params.h"
#include "titan/kernels/dispatch.h"

#define TITAN_ATTENTION_KERNELS                                                                               \
  template <class T>                                                                                          \
  void attention_forward(T* o, float* lse, const T* q, const T* k, const T* v,                                \
                         const ::titan::kernels::AttentionParams& d);                                         \
  template <class T>                                                                                          \
  void attention_backward(T* dq, T* dk, T* dv, const float* lse, const T* dout, const T* q, const T* k,       \
                          const T* v, const T* o, const ::titan::kernels::AttentionParams& d);                \
  /* MLA keys read in place (T = float): see kernels/attention.h mla_attention_forward. */                    \
  template <class T>                                                                                          \
  void mla_attention_forward(T* o, float* lse, const T* q, const T* kv, const T* k_rope, int64_t nope_dim,    \
                             const ::titan::kernels::AttentionParams& d);                                     \
  template <class T>                                                                                          \
  void mla_attention_backward(T* dq, T* dkv, T* dk_rope, const float* lse, const T* dout, const T* q,         \
                              const T* kv, const T* k_rope, const T* o, int64_t nope_dim,                     \
                              const ::titan::kernels::AttentionParams& d, bool accumulate);
TITAN_FOR_EACH_ISA(TITAN_ATTENTION_KERNELS)
