// Rows of the op table for kernels/v4_attention (DeepSeek-V4's attention over window, compressed
// entries and sink), through the Tensor API under the fast and the reference backend. dims =
// {B, S, H, D, W, m, K} (K = 0: HCA; T = floor(S / m)): V4's shapes (H = 16 at D = 64 and 512,
// W = 128 with CSA m = 4 and HCA m = 128), S not a multiple of m (a tail with no entry), the window
// larger than S, S < m (no entry: a sliding-only layer), K larger than the visible entries (CSA
// rows also hold future, -1 and out-of-range slots), one head, odd head counts and widths (7 and
// 37 heads, D = 1, 33), 20 heads (a second, mostly padding head tile), and more keys than one
// chunk of the fast kernel holds (128 KiB of rows: 64 keys at D = 512, 32 at D = 1000), so the
// online softmax and dq's sum run over several chunks (a chunk boundary inside the window, and
// inside the CSA slots). The chunk rows {.., E, P0} (context parallelism): E raw key rows before
// the queries (the window's W - 1, fewer, none, or more than the window reaches) and the first
// query at position P0, for CSA, HCA and sliding-only, one spanning several key chunks at D = 512.
#include "common/backend_compare.h"
#include "common/v4_attention_inputs.h"
#include "titan/kernels/v4_attention.h"

using namespace titan;
using namespace titan::test;

namespace {

const std::vector<std::string> kDims = {"B", "S", "H", "D", "W", "m", "K", "E", "P0"};

void forward(Tensor& o, Tensor& lse, const V4AttentionCase& c) {
  kernels::v4_attention_forward(o, lse, c.q, c.kv, c.comp, c.idx, c.sink, c.d.W, c.d.ratio, c.d.scale, nullptr, c.d.P0);
}

}  // namespace

TITAN_OP_CASES(v4_attention) {
  std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 1, 1, 1, 2, 0},      {1, 7, 1, 33, 16, 4, 3},     {2, 19, 3, 16, 5, 4, 8},   {1, 23, 7, 33, 4, 3, 0},
      {2, 61, 4, 64, 16, 4, 4},   {2, 61, 4, 64, 16, 8, 0},    {1, 9, 5, 40, 3, 16, 0},   {1, 9, 5, 40, 3, 16, 2},
      {1, 40, 37, 24, 64, 5, 50}, {1, 30, 20, 48, 7, 2, 6},    {1, 140, 16, 64, 128, 4, 16},
      {1, 260, 4, 64, 128, 128, 0},  {1, 24, 16, 512, 8, 4, 4},  {1, 90, 4, 512, 70, 4, 0},
      {1, 60, 3, 1000, 40, 5, 12},   {1, 110, 3, 512, 50, 2, 70},
  };
  for (auto& s : shapes) s.insert(s.end(), {0, 0});
  const std::vector<std::vector<int64_t>> chunks = {
      {1, 16, 4, 64, 16, 4, 4, 15, 48},  {2, 32, 3, 33, 8, 4, 0, 7, 32},     {1, 24, 5, 64, 70, 4, 6, 50, 100},
      {1, 12, 2, 16, 1, 4, 3, 0, 36},    {2, 9, 3, 40, 6, 16, 0, 5, 7},      {1, 20, 16, 512, 40, 16, 0, 39, 80},
      {1, 21, 7, 64, 9, 3, 9, 8, 63},    {1, 20, 4, 512, 90, 4, 30, 70, 120},
  };
  shapes.insert(shapes.end(), chunks.begin(), chunks.end());
  std::vector<std::vector<int64_t>> csa_shapes;
  for (const auto& s : shapes)
    if (s[6] > 0) csa_shapes.push_back(s);
  return {
      {"v4_attention_forward", kDims, shapes,
       [](const OpInput& in) {
         const V4AttentionCase c(in.dims, in.dtype, in.seed);
         return fast_vs_reference({"o", "lse"}, [&] {
           Tensor o = Tensor::empty(c.q.shape(), in.dtype), lse = Tensor::empty({c.d.B, c.d.S, c.d.H}, DType::f32);
           forward(o, lse, c);
           return std::vector<Tensor>{o, lse};
         });
       }},
      // head_mean (the CSA indexer's target) beside o and lse, on the CSA rows (K > 0).
      {"v4_attention_forward_head_mean", kDims, csa_shapes,
       [](const OpInput& in) {
         const V4AttentionCase c(in.dims, in.dtype, in.seed);
         return fast_vs_reference({"o", "lse", "head_mean"}, [&] {
           Tensor o = Tensor::empty(c.q.shape(), in.dtype), lse = Tensor::empty({c.d.B, c.d.S, c.d.H}, DType::f32);
           Tensor hm = Tensor::empty({c.d.B, c.d.S, c.d.K}, DType::f32);
           kernels::v4_attention_forward(o, lse, c.q, c.kv, c.comp, c.idx, c.sink, c.d.W, c.d.ratio, c.d.scale, &hm,
                                         c.d.P0);
           return std::vector<Tensor>{o, lse, hm};
         });
       }},
      {"v4_attention_backward", kDims, shapes,
       [](const OpInput& in) {
         const V4AttentionCase c(in.dims, in.dtype, in.seed);
         // One forward (reference) feeds both backends' backward, so they see the same o and lse.
         const kernels::KernelBackend saved = kernels::kernel_backend();
         kernels::set_kernel_backend(kernels::KernelBackend::reference);
         Tensor o = Tensor::empty(c.q.shape(), in.dtype), lse = Tensor::empty({c.d.B, c.d.S, c.d.H}, DType::f32);
         forward(o, lse, c);
         kernels::set_kernel_backend(saved);
         const Tensor dout = random_tensor(o.shape(), in.dtype, in.seed, "dout");
         return fast_vs_reference({"dq", "dkv", "dcomp", "dsink"}, [&] {
           Tensor dq = Tensor::empty(c.q.shape(), in.dtype), dkv = Tensor::empty(c.kv.shape(), in.dtype);
           Tensor dcomp = Tensor::empty(c.comp.shape(), in.dtype), dsink = Tensor::empty({c.d.H}, DType::f32);
           kernels::v4_attention_backward(dq, dkv, dcomp, dsink, dout, c.q, c.kv, c.comp, c.idx, c.sink, o, lse, c.d.W,
                                          c.d.ratio, c.d.scale, c.d.P0);
           return std::vector<Tensor>{dq, dkv, dcomp, dsink};
         });
       }},
  };
}
