// Each fused op and its small-op form (autograd/small_op_forms.h), the pairs `[model]
// converters` swaps: the same values and the same gradients of every input, in f32, on awkward
// shapes (odd widths, one head, partial RoPE, experts without rows, repeated choices).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "titan/autograd/ops.h"
#include "titan/autograd/hyper_connection.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/autograd/v4_small_op_forms.h"
#include "titan/core/rng.h"
#include "titan/kernels/moe_permute.h"

using namespace titan;
using autograd::Variable;

namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Generator g(seed, "small_op_forms");
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(lo + (hi - lo) * g.next_uniform());
  return t;
}

using Fn = std::function<Variable(const std::vector<Variable>&)>;

// The output and every input's gradient of L = sum(y * probe).
std::vector<Tensor> run(const std::vector<Tensor>& inputs, const Fn& fn) {
  std::vector<Variable> vars;
  for (const Tensor& t : inputs) vars.emplace_back(t.clone(), true);
  Variable y = fn(vars);
  autograd::backward(y, random_tensor(y.shape(), 7));
  std::vector<Tensor> out = {y.value()};
  for (const Variable& v : vars) out.push_back(v.grad());
  return out;
}

void expect_same(const std::string& name, const std::vector<Tensor>& inputs, const Fn& fused, const Fn& small,
                 double tol = 2e-5) {
  const std::vector<Tensor> a = run(inputs, fused), b = run(inputs, small);
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string what = name + (i == 0 ? " output" : " gradient of input " + std::to_string(i - 1));
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << what;
    ASSERT_EQ(a[i].shape(), b[i].shape()) << what;
    double worst = 0;
    for (int64_t e = 0; e < a[i].numel(); ++e) {
      const double x = a[i].data<float>()[e], y = b[i].data<float>()[e];
      worst = std::max(worst, std::fabs(x - y) / (1 + std::fabs(x)));
    }
    EXPECT_LE(worst, tol) << what;
  }
}

Tensor positions(int64_t n, int64_t max_position, uint64_t seed) {
  Tensor p = Tensor::empty({n}, DType::i32);
  Generator g(seed, "positions");
  for (int64_t i = 0; i < n; ++i) p.data<int32_t>()[i] = int32_t(g.next_uniform() * double(max_position));
  return p;
}

}  // namespace

TEST(SmallOpForms, RmsNorm) {
  for (const Shape& s : {Shape{3, 5, 7}, Shape{1, 1}, Shape{13, 33}})
    expect_same("rmsnorm " + s.str(), {random_tensor(s, 1), random_tensor({s.back()}, 2, 0.5, 1.5)},
                [](const std::vector<Variable>& v) { return autograd::rmsnorm(v[0], v[1], 1e-5); },
                [](const std::vector<Variable>& v) { return autograd::rmsnorm_small_ops(v[0], v[1], 1e-5); });
}

TEST(SmallOpForms, Rope) {
  kernels::RopeConfig c;
  c.rope_dims = 6;
  c.theta = 10000;
  const kernels::RopeTables tables = kernels::rope_tables(c, 40);
  struct Case {
    Shape shape;
    int64_t offset;
  };
  // All dims rotated; partial with dims after; MLA's q (rope last); one head; a [N, 1, d_c + d_r] kv row.
  for (const Case& k : {Case{{2, 3, 4, 6}, 0}, Case{{5, 2, 11}, 2}, Case{{3, 2, 9}, 3}, Case{{7, 1, 6}, 0}, Case{{4, 1, 13}, 7}})
    for (kernels::RopeLayout layout : {kernels::RopeLayout::rotate_half, kernels::RopeLayout::interleaved}) {
      const int64_t tokens = Tensor::empty(k.shape, DType::f32).numel() / (k.shape[k.shape.size() - 2] * k.shape.back());
      const Tensor pos = positions(tokens, 40, uint64_t(tokens));
      expect_same("rope " + k.shape.str() + " at " + std::to_string(k.offset), {random_tensor(k.shape, 3)},
                  [&](const std::vector<Variable>& v) { return autograd::rope(v[0], tables, pos, layout, k.offset); },
                  [&](const std::vector<Variable>& v) {
                    return autograd::rope_small_ops(v[0], tables, pos, layout, k.offset);
                  });
    }
}

TEST(SmallOpForms, GroupedMatmul) {
  // Experts without rows (first, middle, last), a one-row expert, odd widths.
  const std::vector<int64_t> offsets = {0, 0, 5, 6, 6, 19, 19};
  const int64_t m = offsets.back(), e = int64_t(offsets.size()) - 1, n = 7, k = 9;
  expect_same("grouped_matmul", {random_tensor({m, k}, 4), random_tensor({e, n, k}, 5)},
              [&](const std::vector<Variable>& v) { return autograd::grouped_matmul(v[0], v[1], offsets); },
              [&](const std::vector<Variable>& v) { return autograd::grouped_matmul_small_ops(v[0], v[1], offsets); });
}

TEST(SmallOpForms, PermuteAndUnpermute) {
  // 11 tokens, top-3 of 5 experts (expert 4 never chosen).
  const int64_t t = 11, k = 3, experts = 5, d = 6;
  Tensor idx = Tensor::empty({t, k}, DType::i32);
  for (int64_t i = 0; i < t * k; ++i) idx.data<int32_t>()[i] = int32_t((i * 7 + i / k) % 4);
  for (int64_t i = 0; i < t; ++i)  // distinct experts per token, as top-k gives
    if (idx.data<int32_t>()[i * k] == idx.data<int32_t>()[i * k + 1]) idx.data<int32_t>()[i * k + 1] = 4 - 1 - idx.data<int32_t>()[i * k];
  const kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, experts);
  expect_same("moe_permute", {random_tensor({t, d}, 6)},
              [&](const std::vector<Variable>& v) { return autograd::moe_permute(v[0], disp.pos); },
              [&](const std::vector<Variable>& v) { return autograd::moe_permute_small_ops(v[0], disp.pos); });
  expect_same("moe_unpermute", {random_tensor({t * k, d}, 8), random_tensor({t, k}, 9, 0, 1)},
              [&](const std::vector<Variable>& v) { return autograd::moe_unpermute(v[0], disp.pos, v[1]); },
              [&](const std::vector<Variable>& v) { return autograd::moe_unpermute_small_ops(v[0], disp.pos, v[1]); });
}

// bf16 inputs: the small-op forms compute in f32 and return bf16, within bf16's rounding of the
// fused kernels.
TEST(SmallOpForms, Bf16InputsComeBackInBf16) {
  const Tensor x = random_tensor({4, 8}, 10).to(DType::bf16), w = random_tensor({8}, 11, 0.5, 1.5);
  const Variable fused = autograd::rmsnorm(Variable(x), Variable(w), 1e-5);
  const Variable small = autograd::rmsnorm_small_ops(Variable(x), Variable(w), 1e-5);
  ASSERT_EQ(small.dtype(), DType::bf16);
  const Tensor a = fused.value().to(DType::f32), b = small.value().to(DType::f32);
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.data<float>()[i], b.data<float>()[i], 2e-2);
}

// DeepSeek-V4's mHC ops and compressor (autograd/v4_small_op_forms.h): 3 and 4 streams, 1, 17
// and 33 tokens, the HyperHead's pre-only weights; CSA (with its borrowed first halves) and HCA
// with a tail of tokens that makes no entry.
TEST(SmallOpForms, MhcOpsMatchTheirFusedKernels) {
  for (const int64_t n : {3, 4}) {
    for (const int64_t t : {1, 17}) {
      const std::string at = " (N = " + std::to_string(n) + ", T = " + std::to_string(t) + ")";
      const int64_t m = (n + 2) * n, d = 9;
      const std::vector<Tensor> w = {random_tensor({t, m}, 1, -2, 2), random_tensor({m}, 2), random_tensor({3}, 3, 0.5, 1.5)};
      expect_same("hc_weights" + at, w,
                  [&](const std::vector<Variable>& v) { return autograd::hc_weights(v[0], v[1], v[2], n, 1e-6); },
                  [&](const std::vector<Variable>& v) { return autograd::hc_weights_small_ops(v[0], v[1], v[2], n, 1e-6); });
      const std::vector<Tensor> head = {random_tensor({t, n}, 4, -2, 2), random_tensor({n}, 5), random_tensor({1}, 6, 0.5, 1.5)};
      expect_same("hc_weights (head)" + at, head,
                  [&](const std::vector<Variable>& v) { return autograd::hc_weights(v[0], v[1], v[2], n, 1e-6); },
                  [&](const std::vector<Variable>& v) { return autograd::hc_weights_small_ops(v[0], v[1], v[2], n, 1e-6); });
      expect_same("sinkhorn" + at, {random_tensor({t, n, n}, 7, -3, 3)},
                  [&](const std::vector<Variable>& v) { return autograd::sinkhorn(v[0], 20, 1e-6); },
                  [&](const std::vector<Variable>& v) { return autograd::sinkhorn_small_ops(v[0], 20, 1e-6); });
      expect_same("hc_collapse" + at, {random_tensor({t, n, d}, 8), random_tensor({t, n}, 9)},
                  [](const std::vector<Variable>& v) { return autograd::hc_collapse(v[0], v[1]); },
                  [](const std::vector<Variable>& v) { return autograd::hc_collapse_small_ops(v[0], v[1]); });
      expect_same("hc_expand" + at,
                  {random_tensor({t, n, d}, 10), random_tensor({t, d}, 11), random_tensor({t, n}, 12), random_tensor({t, n, n}, 13)},
                  [](const std::vector<Variable>& v) { return autograd::hc_expand(v[0], v[1], v[2], v[3]); },
                  [](const std::vector<Variable>& v) { return autograd::hc_expand_small_ops(v[0], v[1], v[2], v[3]); });
    }
  }
}

TEST(SmallOpForms, CompressorMatchesItsFusedKernel) {
  using kernels::CompressorKind;
  for (const CompressorKind kind : {CompressorKind::hca, CompressorKind::csa}) {
    for (const auto& [s, m] : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {37, 4}, {35, 8}}) {
      const int64_t b = 2, d = 5, c = kind == CompressorKind::csa ? 2 * d : d;
      const std::string at = std::string(kind == CompressorKind::csa ? " csa" : " hca") + " (S = " + std::to_string(s) +
                             ", m = " + std::to_string(m) + ")";
      expect_same("compressor" + at, {random_tensor({b, s, c}, 14), random_tensor({b, s, c}, 15, -3, 3), random_tensor({m, c}, 16)},
                  [&](const std::vector<Variable>& v) { return autograd::compressor(v[0], v[1], v[2], m, kind); },
                  [&](const std::vector<Variable>& v) { return autograd::compressor_small_ops(v[0], v[1], v[2], m, kind); });
    }
  }
}
