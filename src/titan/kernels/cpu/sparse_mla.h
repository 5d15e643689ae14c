// Fast sparse MLA attention, forward and backward (per-ISA variants; see cpu/isa.h). Same
// contract as ref/sparse_mla.h with T in {float, bf16}, f32 lse and f32 arithmetic (except the
// bf16 operands of the AMX products below); docs/dsa.md sections 4 and 5.
//
// OpenMP over query rows. Each thread copies its query's valid selected rows once (as f32, in
// slot order) into an L2-sized buffer, and every head reuses them in register-tiled products:
//   forward   scores^T [n, H] = rows x (scale q)^T, softmax across the n slots of each head,
//             o = P^T rows[:, :Dv]
//   backward  [scores | dA]^T = rows x (scale q | dO)^T in one product, P from lse,
//             dS = P (dA - rowsum(dO * O)), dq = scale dS^T rows, and the dkv rows of the selected
//             keys += (scale dS | P) (q ; dO): key and value roles in one product, added in place.
// Invalid slots are never copied, so they cost nothing.
// bf16 in the avx512_bf16 variant (Dqk a multiple of 32; the backward also needs Dv a multiple of
// 32) keeps the rows in bf16 and runs every product (the forward's two, the backward's scores/dA,
// dq and dkv) on bf16 pairs: AMX tile products when cpu_amx_bf16_usable(), else VDPBF16PS in the
// same register tiles as the f32 path (one broadcast pair against 16-pair B rows; on the Zen 5
// machine measured, 35% -> 62% of its bf16 peak at DeepSeek's shapes against the widened f32
// path), with P and dS rounded to bf16 as operands (as FlashMLA does); accumulation and softmax
// stay f32. The AMX notes below are about the tile path. The gather
// interleaves the row pairs (the VNNI operand of P x V and dS x K) while the rows are in L1, and
// the small operands are packed with 16 x 16 transposes. What AMX leaves is memory traffic per
// selected row against only 2 H (Dqk + Dv) resp. 2 H (3 Dqk + 2 Dv) FLOPs per slot: the gather
// (1152 B bf16 per slot); operand tiles streamed from L2, since at H = 16 each gathered row meets
// one 16-head tile row per product, so nearly every tile product needs a fresh 1 KiB tile; the
// dkv product, whose contraction (2 H = 32) is one chunk, so one 1 KiB tile store per product;
// and the dkv scatter-add (2304 B f32 read and written per slot into accumulator rows far
// outside L2). At H = 16 these, not the tile arithmetic, bound the bf16 path. The gathers
// prefetch the kv rows a few slots ahead.
// head_mean (optional): the forward sums the f32 probabilities it already holds over the heads
// of each valid slot (H adds per slot, against 2 H (Dqk + Dv) FLOPs) and scatters the sums back
// to slot order (slots keep their order in the gathered rows); nullptr skips it.
// dkv accumulates in `acc`, `parts` per-thread f32 buffers [parts, Skv, sparse_mla_acc_width(Dqk)]
// (the backward runs on at most `parts` threads), summed into dkv per batch element: no atomics.
// acc must be zero; it is left zero.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/dsa_params.h"

#define TITAN_SPARSE_MLA_KERNELS                                                                                    \
  int64_t sparse_mla_acc_width(int64_t dqk);                                                                        \
  template <class T>                                                                                                \
  void sparse_mla_forward(T* o, float* lse, float* head_mean, const T* q, const T* kv, const int32_t* idx,          \
                          const ::titan::kernels::SparseMlaParams& d);                                              \
  template <class T>                                                                                                \
  void sparse_mla_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,   \
                           const float* lse, float* acc, int64_t parts, const ::titan::kernels::SparseMlaParams& d);
TITAN_FOR_EACH_ISA(TITAN_SPARSE_MLA_KERNELS)
