// Rows of the op table for kernels/sparse_mla, through the Tensor API under the fast and the
// reference backend. dims = {B, S, Skv, H, Dqk, Dv, K, invalid}: S = 1, K larger than the valid
// keys, odd heads and widths (7 and 37 heads, 33/17), the small 40/32 split, DeepSeek's 576/512,
// 128 heads (several head vectors per tile), Skv > S, and invalid = 1 for rows that also draw
// future keys, >= Skv and -1 slots (0: causal top-k rows). The bf16 AMX path (Dqk a multiple of
// 32; its backward also needs Dv a multiple of 32) runs on the 576, 32 and 64 widths; the last
// rows give it two batch elements, 20 heads (two head tiles, the second mostly padding), an odd K,
// an odd head count (an unpaired head in the backward's (q ; dO) head pairs), and 64 and 40 heads
// (four and three head blocks sharing each streamed tile).
#include <cmath>

#include "common/backend_compare.h"
#include "common/sparse_mla_inputs.h"
#include "titan/kernels/sparse_mla.h"

using namespace titan;
using namespace titan::test;

namespace {

struct SparseMlaCase {
  int64_t B, S, Skv, H, Dqk, Dv, K;
  double scale = 0.5;
  Tensor q, kv, idx;

  explicit SparseMlaCase(const OpInput& in)
      : B(in.dims[0]), S(in.dims[1]), Skv(in.dims[2]), H(in.dims[3]), Dqk(in.dims[4]), Dv(in.dims[5]), K(in.dims[6]) {
    // Wide 576-dim rows would give scores of many units at [-2, 2); 1/sqrt(Dqk) keeps the
    // softmax peaked but not one-hot at every width.
    scale = 3.0 / std::sqrt(double(Dqk));
    q = random_tensor({B, S, H, Dqk}, in.dtype, in.seed, "q", -1, 1);
    kv = random_tensor({B, Skv, Dqk}, in.dtype, in.seed, "kv", -1, 1);
    const SparseIdxOptions opt = in.dims[7] ? SparseIdxOptions{false, 0.1} : SparseIdxOptions{};
    idx = random_sparse_idx(B, S, Skv, K, in.seed, "idx", opt);
  }
};

const std::vector<std::string> kDims = {"B", "S", "Skv", "H", "Dqk", "Dv", "K", "invalid"};

}  // namespace

TITAN_OP_CASES(sparse_mla) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 1, 1, 16, 16, 1, 0},    {1, 1, 1, 3, 40, 32, 4, 1},    {2, 17, 17, 3, 40, 32, 8, 0},
      {1, 9, 9, 7, 33, 17, 5, 1},    {1, 33, 50, 5, 72, 40, 16, 1}, {1, 20, 20, 4, 576, 512, 8, 0},
      {1, 70, 90, 16, 576, 512, 32, 1}, {1, 40, 40, 37, 72, 64, 24, 1}, {1, 12, 12, 128, 32, 16, 8, 0},
      {2, 24, 30, 20, 64, 48, 13, 1}, {2, 24, 30, 20, 64, 32, 13, 1}, {1, 9, 12, 3, 32, 32, 5, 1},
      {1, 10, 12, 64, 64, 32, 9, 1},  {1, 9, 9, 40, 32, 32, 7, 0},
  };
  std::vector<std::vector<int64_t>> head_mean_shapes = shapes;
  head_mean_shapes.insert(head_mean_shapes.end(), {{2, 13, 13, 1, 64, 32, 6, 1}, {1, 21, 21, 1, 576, 512, 16, 0},
                                                   {2, 11, 11, 5, 576, 512, 9, 1}, {1, 7, 7, 3, 32, 32, 16, 1},
                                                   {1, 9, 9, 1, 32, 32, 1, 1}});
  return {
      {"sparse_mla_forward", kDims, shapes,
       [](const OpInput& in) {
         const SparseMlaCase c(in);
         return fast_vs_reference({"o", "lse"}, [&] {
           Tensor o = Tensor::empty({c.B, c.S, c.H, c.Dv}, in.dtype), lse = Tensor::empty({c.B, c.S, c.H}, DType::f32);
           kernels::sparse_mla_forward(o, lse, c.q, c.kv, c.idx, c.Dv, c.scale);
           return std::vector<Tensor>{o, lse};
         });
       }},
      // head_mean (the indexer's sparse-stage target) beside o and lse; the rows add H = 1, an odd
      // H at 576 / 512 (the AMX path) with invalid, -1 and future slots, and K = 1 rows drawn from all
      // keys (mostly future: no valid slot).
      {"sparse_mla_forward_head_mean", kDims, head_mean_shapes,
       [](const OpInput& in) {
         const SparseMlaCase c(in);
         return fast_vs_reference({"o", "lse", "head_mean"}, [&] {
           Tensor o = Tensor::empty({c.B, c.S, c.H, c.Dv}, in.dtype), lse = Tensor::empty({c.B, c.S, c.H}, DType::f32);
           Tensor hm = Tensor::empty({c.B, c.S, c.K}, DType::f32);
           kernels::sparse_mla_forward(o, lse, c.q, c.kv, c.idx, c.Dv, c.scale, &hm);
           return std::vector<Tensor>{o, lse, hm};
         });
       }},
      {"sparse_mla_backward", kDims, shapes,
       [](const OpInput& in) {
         const SparseMlaCase c(in);
         // One forward (reference) feeds both backends' backward, so they see the same o and lse.
         const kernels::KernelBackend saved = kernels::kernel_backend();
         kernels::set_kernel_backend(kernels::KernelBackend::reference);
         Tensor o = Tensor::empty({c.B, c.S, c.H, c.Dv}, in.dtype), lse = Tensor::empty({c.B, c.S, c.H}, DType::f32);
         kernels::sparse_mla_forward(o, lse, c.q, c.kv, c.idx, c.Dv, c.scale);
         kernels::set_kernel_backend(saved);
         const Tensor dout = random_tensor(o.shape(), in.dtype, in.seed, "dout");
         return fast_vs_reference({"dq", "dkv"}, [&] {
           Tensor dq = Tensor::empty(c.q.shape(), in.dtype), dkv = Tensor::empty(c.kv.shape(), in.dtype);
           kernels::sparse_mla_backward(dq, dkv, dout, c.q, c.kv, c.idx, o, lse, c.scale);
           return std::vector<Tensor>{dq, dkv};
         });
       }},
  };
}
