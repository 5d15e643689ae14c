// MoE token dispatch on one rank: sort the (token, expert choice) pairs by expert, move token
// rows into the expert-sorted buffer the grouped GEMMs read (permute), and combine the experts'
// outputs back per token weighted by the router (unpermute); both with backward (semantics:
// ref/moe_permute.h). Tensors are contiguous 2-D, f32 or bf16 (one dtype), weights f32.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::kernels {

struct ExpertDispatch {
  Tensor pos;                    // [N, k] i32: row of choice (t, j) in the sorted buffer, a permutation of [0, N k)
  std::vector<int64_t> offsets;  // [E + 1]: expert e owns sorted rows [offsets[e], offsets[e + 1])
  int64_t tokens_of(int64_t e) const { return offsets[size_t(e + 1)] - offsets[size_t(e)]; }
};

// A stable counting sort of indices [N, k] (i32 experts in [0, E)): within an expert, choices
// keep token order, so the layout (and every sum over it) is deterministic.
ExpertDispatch moe_sort_by_expert(const Tensor& indices, int64_t experts);

// xs [N k, D] rows pos[t, j] = x [N, D] row t
void moe_permute_forward(Tensor& xs, const Tensor& x, const Tensor& pos);
// dx [N, D] += sum over j of dxs [N k, D] rows pos[t, j]
void moe_permute_backward(const Tensor& dx, const Tensor& dxs, const Tensor& pos);
// y [N, D] = sum over j of w [N, k] (t, j) * out [N k, D] row pos[t, j]
void moe_unpermute_forward(Tensor& y, const Tensor& out, const Tensor& pos, const Tensor& w);
// dout [N k, D] = the scattered w (t, j) * dy [N, D] row t (written: each row has one source);
// dw [N, k] (f32) += dot(dy row t, out row pos[t, j]). Either may be undefined (skipped).
void moe_unpermute_backward(const Tensor& dout, const Tensor& dw, const Tensor& dy, const Tensor& out,
                            const Tensor& pos, const Tensor& w);

}  // namespace titan::kernels
