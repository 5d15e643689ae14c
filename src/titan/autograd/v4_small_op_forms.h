// The small-op forms of DeepSeek-V4's fused mHC and compressor ops (autograd/hyper_connection.h,
// ops.h's sinkhorn and compressor), each written from the generic differentiable ops as a user
// would write it in PyTorch (transformers' DeepseekV4 modules), computing what its fused twin
// computes; tests/unit/v4_small_op_forms_test.cpp checks values and gradients, and
// bench/bench_converters measures the pairs. f32.
#pragma once

#include <cstdint>

#include "titan/autograd/variable.h"
#include "titan/kernels/compressor.h"

namespace titan::autograd {

// z = mix * scale[group] + base; pre = sigmoid(z) + eps, post = 2 sigmoid(z), the Sinkhorn logits z.
Variable hc_weights_small_ops(const Variable& mix, const Variable& base, const Variable& scale, int64_t n, double eps);
// P = softmax(L) + eps over rows; then columns, and iters - 1 times rows then columns, each
// divided by its sum + eps.
Variable sinkhorn_small_ops(const Variable& logits, int iters, double eps);
// u = pre [T, 1, N] @ x [T, N, d].
Variable hc_collapse_small_ops(const Variable& x, const Variable& pre);
// y = post [T, N, 1] @ a [T, 1, d] + comb^T @ x.
Variable hc_expand_small_ops(const Variable& x, const Variable& a, const Variable& post, const Variable& comb);
// The entries' slots as [B, T, slots, D] tensors of values and gate + position-bias logits (CSA:
// the previous window's first halves, -inf where there is none, then its own second halves), a
// softmax over the slots, and the weighted sum.
Variable compressor_small_ops(const Variable& kv, const Variable& gate, const Variable& bias, int64_t m,
                              kernels::CompressorKind kind);

}  // namespace titan::autograd
