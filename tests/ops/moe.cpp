// Rows of the op table for the MoE kernels: grouped matmul (oneDNN pieces vs the reference
// loops), routing (the threaded row loop vs one pass of the reference) and permute / unpermute
// (per-ISA kernels vs references), all through the Tensor-level API under both backends.
#include <algorithm>
#include <cmath>

#include "common/backend_compare.h"
#include "titan/core/rng.h"
#include "titan/kernels/grouped_matmul.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/moe_router.h"

using namespace titan;
using namespace titan::test;

namespace {

// E + 1 offsets for M rows: random expert sizes, some empty; with `skew` expert 0 takes about
// half the rows (a hot expert whose segment spans several full row blocks).
std::vector<int64_t> random_offsets(int64_t experts, int64_t m, bool skew, uint64_t seed) {
  Generator g(seed, "offsets");
  std::vector<int64_t> cuts = {0, m};
  if (skew) cuts.push_back(m / 2);
  while (int64_t(cuts.size()) < experts + 1) cuts.push_back(int64_t(g.next_below(uint64_t(m + 1))));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Expert choices [N, k]: k distinct experts per token.
Tensor random_choices(int64_t n, int64_t k, int64_t experts, uint64_t seed) {
  Tensor idx = Tensor::empty({n, k}, DType::i32);
  Generator g(seed, "choices");
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      int32_t v;
      bool seen;
      do {
        v = int32_t(g.next_below(uint64_t(experts)));
        seen = false;
        for (int64_t i = 0; i < j; ++i) seen = seen || idx.data<int32_t>()[t * k + i] == v;
      } while (seen);
      idx.data<int32_t>()[t * k + j] = v;
    }
  }
  return idx;
}

Tensor as_f32(const Tensor& i32) {
  Tensor f = Tensor::empty(i32.shape(), DType::f32);
  for (int64_t i = 0; i < i32.numel(); ++i) f.data<float>()[i] = float(i32.data<int32_t>()[i]);
  return f;
}

// Two f32 sums of K products in different orders differ by a few ulps of partial sums growing
// like sqrt(K); a bf16 output can land one rounding step apart.
void set_gemm_tolerance(OpOutputs& outs, int64_t k) {
  const double scale = std::sqrt(double(k));
  for (OpOutput& o : outs) {
    if (o.fast.dtype() == DType::bf16) {
      o.atol = 1e-4 * scale, o.rtol = 8e-3;
    } else {
      o.atol = 1e-5 * scale, o.rtol = 1e-5;
    }
  }
}

// dims = {E, M, N, K, skew}
OpOutputs grouped_forward(const OpInput& in) {
  const int64_t e = in.dims[0], m = in.dims[1], n = in.dims[2], k = in.dims[3];
  const std::vector<int64_t> offsets = random_offsets(e, m, in.dims[4] != 0, in.seed);
  const Tensor a = random_tensor({m, k}, in.dtype, in.seed, "a"), w = random_tensor({e, n, k}, in.dtype, in.seed, "w");
  OpOutputs outs = fast_vs_reference({"c"}, [&] {
    Tensor c = Tensor::empty({m, n}, in.dtype);
    kernels::grouped_matmul_forward(c, a, w, offsets);
    return std::vector<Tensor>{c};
  });
  set_gemm_tolerance(outs, k);
  return outs;
}

OpOutputs grouped_backward(const OpInput& in) {
  const int64_t e = in.dims[0], m = in.dims[1], n = in.dims[2], k = in.dims[3];
  const std::vector<int64_t> offsets = random_offsets(e, m, in.dims[4] != 0, in.seed);
  const Tensor a = random_tensor({m, k}, in.dtype, in.seed, "a"), w = random_tensor({e, n, k}, in.dtype, in.seed, "w");
  const Tensor dc = random_tensor({m, n}, in.dtype, in.seed, "dc");
  OpOutputs outs = fast_vs_reference({"da", "dw", "dw_written", "da_written"}, [&] {
    // Both gradients start nonzero: the kernels accumulate.
    Tensor da = random_tensor({m, k}, in.dtype, in.seed, "da0"), dw = random_tensor({e, n, k}, DType::f32, in.seed, "dw0");
    kernels::grouped_matmul_backward(da, dw, dc, a, w, offsets);
    // dw written over (accumulate_dw false): a NaN-filled buffer must come out as the sums alone,
    // with zeros for experts that have no rows.
    Tensor dw_written = Tensor::full({e, n, k}, std::nan(""), DType::f32);
    kernels::grouped_matmul_backward(Tensor(), dw_written, dc, a, w, offsets, false);
    Tensor da_written = Tensor::full({m, k}, std::nan(""), in.dtype);  // likewise da, every row
    kernels::grouped_matmul_backward(da_written, Tensor(), dc, a, w, offsets, true, false);
    return std::vector<Tensor>{da, dw, dw_written, da_written};
  });
  set_gemm_tolerance(outs, std::max(n, m));
  return outs;
}

// dims = {N, E, k, n_groups, topk_groups, score (0 softmax, 1 sigmoid, 2 sqrtsoftplus), route_norm}
kernels::RouterParams router_params(const std::vector<int64_t>& d) {
  kernels::RouterParams p;
  p.experts = d[1], p.top_k = d[2], p.n_groups = d[3], p.topk_groups = d[4];
  p.score = static_cast<kernels::RouterScore>(d[5]);
  p.route_norm = d[6] != 0;
  p.route_scale = 2.5;
  return p;
}

// sqrtsoftplus logits reach past softplus' threshold (20) and far below 0 (scores near 0).
Tensor router_logits(const OpInput& in, const kernels::RouterParams& p) {
  const double range = p.score == kernels::RouterScore::sqrtsoftplus ? 30 : 4;
  return random_tensor({in.dims[0], p.experts}, DType::f32, in.seed, "logits", -range, range);
}

OpOutputs router_forward(const OpInput& in) {
  const kernels::RouterParams p = router_params(in.dims);
  const int64_t n = in.dims[0];
  const Tensor logits = router_logits(in, p);
  const Tensor bias = random_tensor({p.experts}, DType::f32, in.seed, "bias", -0.1, 0.1);
  return fast_vs_reference({"scores", "indices", "weights"}, [&] {
    Tensor scores = Tensor::empty({n, p.experts}, DType::f32), idx = Tensor::empty({n, p.top_k}, DType::i32),
           w = Tensor::empty({n, p.top_k}, DType::f32);
    kernels::moe_router_forward(scores, idx, w, logits, bias, p);
    return std::vector<Tensor>{scores, as_f32(idx), w};
  });
}

OpOutputs router_backward(const OpInput& in) {
  const kernels::RouterParams p = router_params(in.dims);
  const int64_t n = in.dims[0];
  const Tensor logits = router_logits(in, p);
  Tensor scores = Tensor::empty({n, p.experts}, DType::f32), idx = Tensor::empty({n, p.top_k}, DType::i32),
         w = Tensor::empty({n, p.top_k}, DType::f32);
  kernels::moe_router_forward(scores, idx, w, logits, Tensor(), p);
  const Tensor dw = random_tensor({n, p.top_k}, DType::f32, in.seed, "dw");
  const Tensor ds = random_tensor({n, p.experts}, DType::f32, in.seed, "ds");
  return fast_vs_reference({"dlogits"}, [&] {
    Tensor dl = random_tensor({n, p.experts}, DType::f32, in.seed, "dl0");
    kernels::moe_router_backward(dl, dw, ds, scores, idx, p);
    return std::vector<Tensor>{dl};
  });
}

// Hash routing: a given choice with repeats (any expert, independently per slot), as a tid2eid
// row may hold; the weights forward, then the backward through that choice.
// dims = {N, E, k, score (1 sigmoid, 2 sqrtsoftplus)}
kernels::RouterParams hash_router_params(const std::vector<int64_t>& d) {
  kernels::RouterParams p;
  p.experts = d[1], p.top_k = d[2], p.score = static_cast<kernels::RouterScore>(d[3]);
  p.route_norm = true, p.route_scale = 1.5;
  return p;
}

Tensor repeating_choices(int64_t n, int64_t k, int64_t experts, uint64_t seed) {
  Tensor idx = Tensor::empty({n, k}, DType::i32);
  Generator g(seed, "hash choices");
  for (int64_t i = 0; i < n * k; ++i) idx.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(experts)));
  return idx;
}

OpOutputs router_weights_forward(const OpInput& in) {
  const kernels::RouterParams p = hash_router_params(in.dims);
  const int64_t n = in.dims[0];
  const Tensor logits = router_logits(in, p), idx = repeating_choices(n, p.top_k, p.experts, in.seed);
  return fast_vs_reference({"scores", "weights", "dlogits"}, [&] {
    Tensor scores = Tensor::empty({n, p.experts}, DType::f32), w = Tensor::empty({n, p.top_k}, DType::f32);
    kernels::moe_router_weights_forward(scores, w, logits, idx, p);
    Tensor dl = random_tensor({n, p.experts}, DType::f32, in.seed, "dl0");
    kernels::moe_router_backward(dl, random_tensor({n, p.top_k}, DType::f32, in.seed, "dw"), Tensor(), scores, idx, p);
    return std::vector<Tensor>{scores, w, dl};
  });
}

// dims = {N, k, E, D}
struct PermuteCase {
  int64_t n, k, d;
  kernels::ExpertDispatch disp;
};
PermuteCase permute_case(const OpInput& in) {
  const int64_t n = in.dims[0], k = in.dims[1];
  return {n, k, in.dims[3], kernels::moe_sort_by_expert(random_choices(n, k, in.dims[2], in.seed), in.dims[2])};
}

OpOutputs permute_forward(const OpInput& in) {
  const PermuteCase c = permute_case(in);
  const Tensor x = random_tensor({c.n, c.d}, in.dtype, in.seed, "x");
  OpOutputs outs = fast_vs_reference({"xs"}, [&] {
    Tensor xs = Tensor::empty({c.n * c.k, c.d}, in.dtype);
    kernels::moe_permute_forward(xs, x, c.disp.pos);
    return std::vector<Tensor>{xs};
  });
  outs[0].atol = outs[0].rtol = 0;  // a copy
  return outs;
}

OpOutputs permute_backward(const OpInput& in) {
  const PermuteCase c = permute_case(in);
  const Tensor dxs = random_tensor({c.n * c.k, c.d}, in.dtype, in.seed, "dxs");
  return fast_vs_reference({"dx"}, [&] {
    Tensor dx = random_tensor({c.n, c.d}, in.dtype, in.seed, "dx0");
    kernels::moe_permute_backward(dx, dxs, c.disp.pos);
    return std::vector<Tensor>{dx};
  });
}

OpOutputs unpermute_forward(const OpInput& in) {
  const PermuteCase c = permute_case(in);
  const Tensor out = random_tensor({c.n * c.k, c.d}, in.dtype, in.seed, "out");
  const Tensor w = random_tensor({c.n, c.k}, DType::f32, in.seed, "w", 0, 1);
  return fast_vs_reference({"y"}, [&] {
    Tensor y = Tensor::empty({c.n, c.d}, in.dtype);
    kernels::moe_unpermute_forward(y, out, c.disp.pos, w);
    return std::vector<Tensor>{y};
  });
}

OpOutputs unpermute_backward(const OpInput& in) {
  const PermuteCase c = permute_case(in);
  const Tensor out = random_tensor({c.n * c.k, c.d}, in.dtype, in.seed, "out");
  const Tensor dy = random_tensor({c.n, c.d}, in.dtype, in.seed, "dy");
  const Tensor w = random_tensor({c.n, c.k}, DType::f32, in.seed, "w", 0, 1);
  OpOutputs outs = fast_vs_reference({"dout", "dw"}, [&] {
    Tensor dout = Tensor::empty({c.n * c.k, c.d}, in.dtype);
    Tensor dw = random_tensor({c.n, c.k}, DType::f32, in.seed, "dw0");
    kernels::moe_unpermute_backward(dout, dw, dy, out, c.disp.pos, w);
    return std::vector<Tensor>{dout, dw};
  });
  // dw is a dot product over D in f32: summation order differs (SIMD lanes vs one sum).
  outs[1].atol = 1e-5 * std::sqrt(double(c.d)), outs[1].rtol = 1e-4;
  return outs;
}

// The last rows: the sorted buffer passes the streaming-store threshold (kernels/cpu/chunks.h) in
// f32, with an odd width (unaligned rows: streamed with plain head and tail copies) past one chunk
// of the row kernels; one token with a width past one chunk.
const std::vector<std::vector<int64_t>> kPermuteShapes = {
    {1, 1, 1, 1},       {5, 2, 3, 7},      {17, 3, 8, 33},     {64, 4, 16, 129},
    {300, 8, 64, 96},   {1000, 6, 64, 300}, {1030, 4, 16, 1031}, {1, 3, 4, 515}};

const std::vector<std::string> kGroupedDims = {"E", "M", "N", "K", "skew"};
const std::vector<std::string> kRouterDims = {"N", "E", "k", "n_groups", "topk_groups", "score", "route_norm"};
const std::vector<std::string> kHashRouterDims = {"N", "E", "k", "score"};
const std::vector<std::string> kPermuteDims = {"N", "k", "E", "D"};

}  // namespace

TITAN_OP_CASES(moe) {
  const std::vector<std::vector<int64_t>> grouped_shapes = {
      {1, 1, 1, 1, 0},   {3, 7, 5, 3, 0},     {4, 37, 13, 17, 0},  {8, 100, 33, 65, 0},
      {5, 300, 64, 32, 1}, {2, 1300, 40, 24, 1}, {16, 64, 16, 16, 0},
      // Segments past one full row block with unaligned rests, the last one ending the buffer
      // (its padded tail cannot run in place); M a multiple of the row alignment (every rest in
      // place); a single row; many empty experts.
      {3, 2600, 24, 40, 1}, {4, 256, 32, 64, 0}, {2, 1, 9, 7, 0}, {12, 40, 8, 5, 0}};
  const std::vector<std::vector<int64_t>> router_shapes = {
      {1, 1, 1, 1, 1, 0, 0},  {7, 8, 2, 1, 1, 0, 0},   {33, 8, 3, 1, 1, 1, 1},  {64, 16, 4, 4, 2, 1, 1},
      {100, 16, 4, 4, 2, 0, 0}, {513, 64, 6, 8, 3, 0, 1}, {300, 256, 8, 8, 4, 1, 1},
      // DeepSeek-V4's sqrtsoftplus, renormalised, plain and group-limited
      {1, 1, 1, 1, 1, 2, 1},  {37, 8, 2, 1, 1, 2, 1},  {515, 256, 6, 1, 1, 2, 1}, {64, 16, 4, 4, 2, 2, 1}};
  const std::vector<std::vector<int64_t>> hash_router_shapes = {
      {1, 1, 1, 2}, {13, 8, 2, 2}, {77, 16, 6, 2}, {513, 256, 6, 2}, {40, 8, 3, 1}};
  return {
      {"grouped_matmul_forward", kGroupedDims, grouped_shapes, grouped_forward},
      {"grouped_matmul_backward", kGroupedDims, grouped_shapes, grouped_backward},
      {"moe_router_forward", kRouterDims, router_shapes, router_forward, {DType::f32}},
      {"moe_router_backward", kRouterDims, router_shapes, router_backward, {DType::f32}},
      {"moe_router_weights_forward", kHashRouterDims, hash_router_shapes, router_weights_forward, {DType::f32}},
      {"moe_permute_forward", kPermuteDims, kPermuteShapes, permute_forward},
      {"moe_permute_backward", kPermuteDims, kPermuteShapes, permute_backward},
      {"moe_unpermute_forward", kPermuteDims, kPermuteShapes, unpermute_forward},
      {"moe_unpermute_backward", kPermuteDims, kPermuteShapes, unpermute_backward},
  };
}
