// Fast DeepSeek-V4 attention over [window | compressed entries | sink], forward and backward
// (per-ISA variants; see cpu/isa.h). Same contract as ref/v4_attention.h with T in {float, bf16},
// f32 lse, sink and dsink, and f32 arithmetic, except that bf16 in the avx512_bf16 variant with D
// a multiple of 32 runs every product on bf16 pairs (VDPBF16PS in the same register tiles; the
// key rows as stored, q and dO packed by head, P and dS rounded to bf16 as operands, as FlashMLA
// does; sums, softmax and accumulators f32). Other bf16 calls widen the rows to f32.
//
// OpenMP over queries. Each thread lists its query's visible keys (the window's raw rows, then
// the visible or selected compressed entries) and copies them, as f32, chunk by chunk (128 KiB of
// rows, which stay in L2 through the products) into a buffer that every head reuses in the
// register-tiled products of cpu/mqa_rows.h, as sparse MLA does:
//   forward   per chunk: scores^T [cn, H] = rows x (scale q)^T, an online softmax across heads
//             (running max and sum, started from the sink), out = alpha out + exp(s - m)^T rows;
//             o = out / sum, lse = m + ln(sum)
//   backward  per chunk (P comes from lse, so chunks are independent): [scores | dA]^T =
//             rows x (scale q | dO)^T in one product, dS = P (dA - rowsum(dO * O)),
//             dq += scale dS^T rows, and the key rows += (scale dS | P) (q ; dO): key and value
//             roles (K = V) in one product, added in place; dsink = -sum p_sink rowsum(dO * O).
// No S x S (or S x T) buffer exists: a query's scores live in its thread's [chunk, H] tile.
// f32 with H < 16 heads runs 16 / H neighbouring queries per block, whose (query, head) pairs
// fill the tiles' 16 columns over the union of their windows (and an HCA layer's visible
// entries), each key biased away for the queries that do not see it. A CSA layer's selected
// entries then run per query, heads as rows and keys as columns (cpu/v4_csa_entries.h): the
// block's queries select different entries, whose union at long S would be mostly padding.
// head_mean (CSA, optional): each head's softmax over the query's valid slots alone, from the
// same scores, and the head mean per slot.
// The key-row gradients accumulate in `acc`, `parts` per-thread f32 buffers [parts, Skv + T,
// v4_attention_acc_width(D)] (rows 0..Skv-1 raw keys, Skv.. compressed entries; the backward runs on
// at most `parts` threads), summed into dkv and dcomp per batch element: no atomics. acc must be
// zero; it is left zero.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/v4_attention_params.h"

#define TITAN_V4_ATTENTION_KERNELS                                                                                 \
  int64_t v4_attention_acc_width(int64_t d);                                                                       \
  template <class T>                                                                                               \
  void v4_attention_forward(T* o, float* lse, float* head_mean, const T* q, const T* kv, const T* comp,          \
                            const int32_t* idx, const float* sink, const ::titan::kernels::V4AttentionParams& d);  \
  template <class T>                                                                                               \
  void v4_attention_backward(T* dq, T* dkv, T* dcomp, float* dsink, const T* dout, const T* q, const T* kv,        \
                             const T* comp, const int32_t* idx, const float* sink, const T* o, const float* lse,   \
                             float* acc, int64_t parts, const ::titan::kernels::V4AttentionParams& d);
TITAN_FOR_EACH_ISA(TITAN_V4_ATTENTION_KERNELS)
