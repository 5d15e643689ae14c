// Differentiable ops: each runs its forward kernel, and records a backward (beside it in
// ops.cpp) that accumulates into its inputs' gradients. Activations are f32 or bf16 (the compute
// dtype); parameters are f32 masters, optionally with a bf16 `compute` copy that the GEMMs read.
#pragma once

#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "titan/autograd/variable.h"
#include "titan/kernels/activation.h"
#include "titan/kernels/compressor.h"
#include "titan/kernels/rope.h"

namespace titan::autograd {

// y [..., out] = x [..., in] @ w [out, in]^T. The GEMM reads w_compute when given (a bf16 copy of
// the f32 master w, for mixed precision); dw accumulates into w's f32 gradient.
Variable linear(const Variable& x, const Variable& w, const Tensor& w_compute = Tensor());

// y [..., D] (dtype) = table [V, D] rows at ids (i32, any shape).
Variable embedding(const Tensor& ids, const Variable& table, DType dtype);

// y = x * rstd(x) * w over the last dim.
Variable rmsnorm(const Variable& x, const Variable& w, double eps);

// y = (x - mean(x)) * rstd(x) * w + b over the last dim (w, b f32 [D]).
Variable layernorm(const Variable& x, const Variable& w, const Variable& b, double eps);

// RoPE on x [..., H, Dh] with per-token positions (i32, x.numel() / (H * Dh) entries).
Variable rope(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
              kernels::RopeLayout layout, int64_t rope_offset = 0);
// x turned back by -theta (RoPE's inverse and transpose): DeepSeek-V4 rotates its attention
// output's rope slice back to the query's frame, since its values carry RoPE.
Variable rope_inverse(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
                      kernels::RopeLayout layout, int64_t rope_offset = 0);

// Causal flash attention: q [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv] -> [B, S, H, Dv].
// lse_out, when given, receives the rows' log-sum-exp [B, H, S] f32 (not differentiable), e.g. for
// a loss whose target is this attention's probabilities.
Variable attention(const Variable& q, const Variable& k, const Variable& v, std::optional<double> scale = std::nullopt,
                   Tensor* lse_out = nullptr);

// silu(gate) * up, element-wise; with a finite limit (DeepSeek-V4's swiglu_limit) the inputs are
// clamped first: silu(min(gate, limit)) * clamp(up, -limit, limit) (kernels/activation.h).
Variable swiglu(const Variable& gate, const Variable& up, double limit = kernels::kNoSwigluLimit);

// a + alpha * b (same shape and dtype).
Variable add(const Variable& a, const Variable& b, double alpha = 1.0);

// A view with another shape (same number of elements); x must be contiguous.
Variable view(const Variable& x, const Shape& shape);

// y [..., length] = x[..., start : start + length], a contiguous copy (splits a fused projection).
Variable narrow_last(const Variable& x, int64_t start, int64_t length);

// y [..., H, Da + Db] = [a | b] along the last dim, with a [..., H, Da] and b [..., H, Db], or
// b [..., 1, Db] broadcast to all H heads (MLA's rope key, shared by every head). Same dtype.
Variable concat_last(const Variable& a, const Variable& b);

// MLA's per-head keys and values from the up-projected latent kv [..., H, Dn + Dv] and the shared
// rope key k_rope [..., 1, Dr]: k [..., H, Dn + Dr] = [kv[..., :Dn] | k_rope], v [..., H, Dv] =
// kv[..., Dn:]. One copy each way, where narrow_last x2 + concat_last copied the keys twice and
// zero-filled a kv-sized gradient in each narrow's backward. Same dtype.
std::pair<Variable, Variable> mla_keys_values(const Variable& kv, const Variable& k_rope, int64_t nope_dim);

// attention(q, mla_keys_values(kv, k_rope, nope_dim), scale) in one op: in f32 the kernels read the
// keys and values inside kv and k_rope, so neither they nor their gradients are assembled in memory
// (bf16 runs the two ops, for attention's AMX kernels).
// q [B, S, H, Dn + Dr], kv [B, S, H, Dn + Dv], k_rope [B, S, 1, Dr] -> [B, S, H, Dv].
Variable mla_attention(const Variable& q, const Variable& kv, const Variable& k_rope, int64_t nope_dim,
                       std::optional<double> scale = std::nullopt);

// The mean cross-entropy over tokens whose target is not -100: logits [N, V] (f32 or bf16),
// targets [N] i32. Returns a one-element f32 Variable. The logits buffer is reused for its own
// gradient in backward (it is not needed after), so no [N, V] gradient is allocated.
Variable cross_entropy(const Variable& logits, const Tensor& targets);

// ---- MoE dispatch and expert GEMMs (kernels/moe_permute.h, kernels/grouped_matmul.h) as
// single ops: the fused forms `[model] converters` can swap for small ops (small_op_forms.h).

// xs [N k, D] rows pos[t, j] = x [N, D] row t (pos [N, k] i32, a permutation of [0, N k)).
Variable moe_permute(const Variable& x, const Tensor& pos);

// y [N, D] = sum over j of weights [N, k] (t, j) * out [N k, D] row pos[t, j]; weights f32.
Variable moe_unpermute(const Variable& out, const Tensor& pos, const Variable& weights);

// c [M, N] = per expert e: a rows [offsets[e], offsets[e + 1]) @ w[e]^T, w [E, N, K]. The GEMM
// reads w_compute when given (w's bf16 copy); dw accumulates into w's f32 gradient.
Variable grouped_matmul(const Variable& a, const Variable& w, std::span<const int64_t> offsets,
                        const Tensor& w_compute = Tensor());

// ---- generic small ops ----------------------------------------------------------------------
// The building blocks of reference paths written from small differentiable ops (e.g. DeepSeek
// Sparse Attention's "small_ops" implementation, the oracle its fused kernels are checked
// against). f32, contiguous inputs; outputs are contiguous.

// c = op(a) @ op(b), batched over a's leading dims: a [..., M, K] ([..., K, M] with trans_a),
// b [..., K, N] ([..., N, K] with trans_b) with a's leading dims, or 2-D (shared by the batch).
Variable matmul(const Variable& a, const Variable& b, bool trans_a = false, bool trans_b = false);

// max(x, 0) element-wise (gradient 0 at 0).
Variable relu(const Variable& x);

// alpha * x.
Variable scale(const Variable& x, double alpha);

// a * b element-wise, b the same shape as a or broadcast to it (numpy rules: b's dims, aligned
// right, are 1 or a's; e.g. x [N, H, D] * w [D], x [N, D] * r [N, 1]).
Variable mul(const Variable& a, const Variable& b);

// x + c element-wise.
Variable add_scalar(const Variable& x, double c);

// 1 / sqrt(x) element-wise.
Variable rsqrt(const Variable& x);

// 1 / x element-wise.
Variable reciprocal(const Variable& x);

// 1 / (1 + exp(-x)) element-wise.
Variable sigmoid(const Variable& x);

// a + b with b broadcast to a's shape as mul broadcasts it (e.g. x [B, T, m, C] + bias [m, C]).
Variable add_broadcast(const Variable& a, const Variable& b);

// y [..., 1] = the mean of x [..., D] over its last dim (keepdim).
Variable mean_last(const Variable& x);

// y = x[..., start : start + length, ...] along `dim`, a contiguous copy.
Variable narrow(const Variable& x, int dim, int64_t start, int64_t length);

// y = rows [start, start + length) of a contiguous f32 x [R, ...], a view: nothing is read, so
// it can stand for a slice of a weight whose GEMM reads a compute copy (mixed precision), even
// while FSDP holds only that copy unsharded. The gradient is added into those rows of dx.
Variable narrow_rows_view(const Variable& x, int64_t start, int64_t length);

// The parts joined along `dim` (torch.cat); all other dims equal.
Variable concat(const std::vector<Variable>& parts, int dim);

// y [M, ...] = x [R, ...] rows at index (i32, M entries in [0, R), any shape read flat)
// (torch.index_select(x, 0, index)). Gradient: index_add.
Variable index_select(const Variable& x, const Tensor& index);

// y [rows, ...] = zeros, then y[index[i]] += src [M, ...] row i for each i in order
// (torch.zeros(rows, ...).index_add_(0, index, src)). Gradient: index_select.
Variable index_add(int64_t rows, const Tensor& index, const Variable& src);

// x with dims d0 and d1 swapped, as a contiguous copy.
Variable transpose(const Variable& x, int d0, int d1);

// y = x where keep != 0, else value (e.g. -inf: an additive attention mask). keep is u8 with x's
// shape, or with a 1 in dim 1 to broadcast over it (x [B, H, S, S'], keep [B, 1, S, S']).
// Gradient: dy where kept, 0 elsewhere.
Variable masked_fill(const Variable& x, const Tensor& keep, double value);

// Softmax and log-softmax over the last dim. A row of -inf gives softmax 0 and log_softmax -inf
// with zero gradient; -inf entries of other rows get probability 0.
Variable softmax(const Variable& x);
Variable log_softmax(const Variable& x);
// mHC's Sinkhorn projection (kernels/sinkhorn.h): logits [..., N, N] f32 -> each matrix made
// nearly doubly stochastic (row softmax, then iters column and iters - 1 row normalisations).
// Saves only the logits: backward recomputes the iterations.
Variable sinkhorn(const Variable& logits, int iters, double eps);
// DeepSeek-V4's compressor pooling (kernels/compressor.h): kv and gate [B, S, C], the position
// bias [m, C] -> entries [B, S / m, D] (C = D for HCA, 2D for CSA). Saves its inputs: backward
// recomputes the slot weights.
Variable compressor(const Variable& kv, const Variable& gate, const Variable& bias, int64_t m,
                    kernels::CompressorKind kind);

// DeepSeek-V4's attention over [sliding window | compressed entries | sink], fused
// (kernels/v4_attention.h has the shapes, masks and formula): q [B, S, H, D], kv [B, Skv, D] (the
// one K = V head; Skv >= S, the queries the last S rows), comp [B, T, D] (T <= floor((pos0 + S) /
// m), 0 on a sliding-only layer; pos0 the first query's global position), idx [B, S, K] i32
// (CSA's selected entries; a constant) or undefined (HCA: every visible entry), sink [H] f32
// -> o [B, S, H, D]. f32 or bf16 (q, kv and comp share it). Saves its inputs, o and the
// [B, S, H] lse; no S x S tensor exists in forward or backward. head_mean_out, when given (CSA),
// receives the indexer's KL target [B, S, K] f32 (kernels/v4_attention.h; not differentiable).
Variable v4_attention(const Variable& q, const Variable& kv, const Variable& comp, const Tensor& idx,
                      const Variable& sink, int64_t window, int64_t ratio, double scale,
                      Tensor* head_mean_out = nullptr, int64_t pos0 = 0);

// The sum of all elements: a one-element f32 Variable.
Variable sum(const Variable& x);

// x converted to `dtype` (f32 or bf16); the gradient converts back. The bridge between a bf16
// compute path and f32 small ops.
Variable cast(const Variable& x, DType dtype);

}  // namespace titan::autograd
