// The small-op forms of the ops that have fused kernels: each written from the generic
// differentiable ops (ops.h) as a user would write it in PyTorch, and computing what its fused
// twin computes (tests/unit/small_op_forms_test.cpp checks values and gradients). `[model]
// converters` picks one form per op (models/converters.h); docs/converters.md measures the pairs.
//
// They run in f32: a bf16 input is cast to f32 and the result back (the generic ops are f32).
#pragma once

#include <cstdint>
#include <span>

#include "titan/autograd/variable.h"
#include "titan/kernels/rope.h"

namespace titan::autograd {

// Which form of such an op runs.
enum class OpForm : uint8_t { fused, small_ops };

// rmsnorm: x * rsqrt(mean(x * x, -1, keepdim) + eps) * w, x [..., D], w [D].
Variable rmsnorm_small_ops(const Variable& x, const Variable& w, double eps);

// rope: on the rotated dims [offset, offset + R) of each head of x [..., H, Dh], with
// c, s = cos[positions], sin[positions]: (x1, x2) -> (x1 c - x2 s, x2 c + x1 s), the pairs
// being halves (rotate_half) or neighbours (interleaved); the other dims pass through.
Variable rope_small_ops(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
                        kernels::RopeLayout layout, int64_t rope_offset = 0);

// grouped_matmul: per expert e, a rows [offsets[e], offsets[e + 1]) @ w[e]^T, joined by rows.
Variable grouped_matmul_small_ops(const Variable& a, const Variable& w, std::span<const int64_t> offsets);

// moe_permute: x [N, D] rows gathered into expert order, xs = x[token_of_row] (token_of_row from
// pos [N, k], the sorted row of each choice).
Variable moe_permute_small_ops(const Variable& x, const Tensor& pos);

// moe_unpermute: y [N, D] = zeros.index_add(0, token_of_row, out * weights[choice_of_row]).
Variable moe_unpermute_small_ops(const Variable& out, const Tensor& pos, const Variable& weights);

// v4_attention, as transformers' eager DeepseekV4Attention computes it: keys = [kv | comp] along
// positions [B, S + T, D], scores = scale q keys^T [B, H, S, S + T] with the window / compressed-
// entry mask (-inf; kernels/v4_attention.h) as a [B, 1, S, S + T] tensor, the sink as one more
// logit column, softmax, the sink column dropped, o = P keys. Forms every S x (S + T) matrix.
Variable v4_attention_small_ops(const Variable& q, const Variable& kv, const Variable& comp, const Tensor& idx,
                                const Variable& sink, int64_t window, int64_t ratio, double softmax_scale);

}  // namespace titan::autograd
