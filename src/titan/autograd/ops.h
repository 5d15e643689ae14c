// Differentiable ops: each runs its forward kernel, and records a backward (beside it in
// ops.cpp) that accumulates into its inputs' gradients. Activations are f32 or bf16 (the compute
// dtype); parameters are f32 masters, optionally with a bf16 `compute` copy that the GEMMs read.
#pragma once

#include <optional>

#include "titan/autograd/variable.h"
#include "titan/kernels/rope.h"

namespace titan::autograd {

// y [..., out] = x [..., in] @ w [out, in]^T. The GEMM reads w_compute when given (a bf16 copy of
// the f32 master w, for mixed precision); dw accumulates into w's f32 gradient.
Variable linear(const Variable& x, const Variable& w, const Tensor& w_compute = Tensor());

// y [..., D] (dtype) = table [V, D] rows at ids (i32, any shape).
Variable embedding(const Tensor& ids, const Variable& table, DType dtype);

// y = x * rstd(x) * w over the last dim.
Variable rmsnorm(const Variable& x, const Variable& w, double eps);

// RoPE on x [..., H, Dh] with per-token positions (i32, x.numel() / (H * Dh) entries).
Variable rope(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
              kernels::RopeLayout layout, int64_t rope_offset = 0);

// Causal flash attention: q [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv] -> [B, S, H, Dv].
Variable attention(const Variable& q, const Variable& k, const Variable& v, std::optional<double> scale = std::nullopt);

// silu(gate) * up, element-wise.
Variable swiglu(const Variable& gate, const Variable& up);

// a + alpha * b (same shape and dtype).
Variable add(const Variable& a, const Variable& b, double alpha = 1.0);

// A view with another shape (same number of elements); x must be contiguous.
Variable view(const Variable& x, const Shape& shape);

// y [..., length] = x[..., start : start + length], a contiguous copy (splits a fused projection).
Variable narrow_last(const Variable& x, int64_t start, int64_t length);

// y [..., H, Da + Db] = [a | b] along the last dim, with a [..., H, Da] and b [..., H, Db], or
// b [..., 1, Db] broadcast to all H heads (MLA's rope key, shared by every head). Same dtype.
Variable concat_last(const Variable& a, const Variable& b);

// The mean cross-entropy over tokens whose target is not -100: logits [N, V] (f32 or bf16),
// targets [N] i32. Returns a one-element f32 Variable. The logits buffer is reused for its own
// gradient in backward (it is not needed after), so no [N, V] gradient is allocated.
Variable cross_entropy(const Variable& logits, const Tensor& targets);

}  // namespace titan::autograd
