// Gradient checks of the generic small autograd ops (autograd/ops.h: matmul, relu, scale, mul,
// transpose, masked_fill, softmax, log_softmax, sum, layernorm; the building blocks of the
// converters' small-op forms: broadcast mul and add, add_scalar, rsqrt, reciprocal, sigmoid,
// mean_last, narrow, concat,
// index_select, index_add) through the tape: the analytic
// backward of L = sum(y * probe) against central differences. The ops are f32, so the
// differences use a 1e-3 step and a 2e-3 tolerance (f32 rounding over the step).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "titan/autograd/ops.h"
#include "titan/core/rng.h"

using namespace titan;
using autograd::Variable;

namespace {

Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -1, double hi = 1, double gap = 0) {
  Tensor t = Tensor::empty(shape, DType::f32);
  Generator g(seed, "small_ops");
  float* d = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = lo + (hi - lo) * g.next_uniform();
    if (std::fabs(v) < gap) v = v < 0 ? -gap : gap;  // keep kinks (relu at 0) out of the step
    d[i] = float(v);
  }
  return t;
}

using Fn = std::function<Variable(const std::vector<Variable>&)>;

void check(const std::string& name, std::vector<Tensor> inputs, const Fn& fn, double tol = 2e-3) {
  std::vector<Variable> vars;
  for (const Tensor& t : inputs) vars.emplace_back(t.clone(), true);
  Variable y = fn(vars);
  const Tensor probe = random_tensor(y.shape(), 99);
  autograd::backward(y, probe);
  auto loss = [&](const std::vector<Tensor>& in) {
    autograd::NoGradGuard no_grad;
    std::vector<Variable> v;
    for (const Tensor& t : in) v.emplace_back(t, false);
    const Tensor out = fn(v).value();
    double l = 0;
    for (int64_t i = 0; i < out.numel(); ++i) l += double(out.data<float>()[i]) * probe.data<float>()[i];
    return l;
  };
  const double eps = 1e-3;
  for (size_t a = 0; a < inputs.size(); ++a) {
    ASSERT_TRUE(vars[a].grad().defined()) << name << ": input " << a << " got no gradient";
    double worst = 0;
    for (int64_t i = 0; i < inputs[a].numel(); ++i) {
      float* x = inputs[a].data<float>() + i;
      const float saved = *x;
      *x = saved + float(eps);
      const double lp = loss(inputs);
      *x = saved - float(eps);
      const double lm = loss(inputs);
      *x = saved;
      const double numeric = (lp - lm) / (2 * eps);
      worst = std::max(worst, std::fabs(numeric - vars[a].grad().data<float>()[i]) / (1 + std::fabs(numeric)));
    }
    EXPECT_LE(worst, tol) << name << ": input " << a;
  }
}

Tensor keep_mask(const Shape& shape, uint64_t seed) {
  Tensor k = Tensor::empty(shape, DType::u8);
  Generator g(seed, "keep");
  for (int64_t i = 0; i < k.numel(); ++i) k.data<uint8_t>()[i] = g.next_uniform() < 0.6;
  return k;
}

}  // namespace

TEST(SmallOpsGradcheck, Matmul) {
  // Batched both sides, every transpose combination, and a 2-D b shared by the batch.
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Shape as = ta ? Shape{2, 3, 4, 5} : Shape{2, 3, 5, 4};
      const Shape bs = tb ? Shape{2, 3, 6, 4} : Shape{2, 3, 4, 6};
      check("matmul", {random_tensor(as, 1), random_tensor(bs, 2)},
            [=](const std::vector<Variable>& v) { return autograd::matmul(v[0], v[1], ta, tb); });
    }
  check("matmul shared b", {random_tensor({3, 5, 4}, 3), random_tensor({6, 4}, 4)},
        [](const std::vector<Variable>& v) { return autograd::matmul(v[0], v[1], false, true); });
}

TEST(SmallOpsGradcheck, ElementWise) {
  check("relu", {random_tensor({3, 7}, 5, -1, 1, 0.05)},
        [](const std::vector<Variable>& v) { return autograd::relu(v[0]); });
  check("scale", {random_tensor({3, 7}, 6)}, [](const std::vector<Variable>& v) { return autograd::scale(v[0], -0.7); });
  check("mul", {random_tensor({2, 9}, 7), random_tensor({2, 9}, 8)},
        [](const std::vector<Variable>& v) { return autograd::mul(v[0], v[1]); });
  check("sum", {random_tensor({4, 5}, 9)}, [](const std::vector<Variable>& v) { return autograd::sum(v[0]); });
  // Adjacent dims above the last (row copies), the leading pair, and a swap with the last dim.
  check("transpose", {random_tensor({2, 3, 4, 5}, 10)},
        [](const std::vector<Variable>& v) { return autograd::transpose(v[0], 1, 2); });
  check("transpose leading", {random_tensor({3, 4, 5}, 23)},
        [](const std::vector<Variable>& v) { return autograd::transpose(v[0], 1, 0); });
  check("transpose last", {random_tensor({3, 4, 5}, 24)},
        [](const std::vector<Variable>& v) { return autograd::transpose(v[0], 1, 2); });
}

TEST(SmallOpsGradcheck, BroadcastAndReductions) {
  check("mul broadcast last", {random_tensor({2, 3, 5}, 30), random_tensor({5}, 31)},
        [](const std::vector<Variable>& v) { return autograd::mul(v[0], v[1]); });
  check("mul broadcast rows", {random_tensor({4, 3, 5}, 32), random_tensor({4, 1, 5}, 33)},
        [](const std::vector<Variable>& v) { return autograd::mul(v[0], v[1]); });
  check("mul broadcast columns", {random_tensor({4, 7}, 34), random_tensor({4, 1}, 35)},
        [](const std::vector<Variable>& v) { return autograd::mul(v[0], v[1]); });
  check("mul broadcast both", {random_tensor({3, 2, 4, 2}, 36), random_tensor({3, 1, 4, 1}, 37)},
        [](const std::vector<Variable>& v) { return autograd::mul(v[0], v[1]); });
  check("add_scalar", {random_tensor({3, 5}, 38)},
        [](const std::vector<Variable>& v) { return autograd::add_scalar(v[0], 0.25); });
  check("rsqrt", {random_tensor({3, 5}, 39, 0.5, 2.0)}, [](const std::vector<Variable>& v) { return autograd::rsqrt(v[0]); });
  check("reciprocal", {random_tensor({3, 5}, 41, 0.5, 2.0)},
        [](const std::vector<Variable>& v) { return autograd::reciprocal(v[0]); });
  check("sigmoid", {random_tensor({3, 5}, 42, -3, 3)}, [](const std::vector<Variable>& v) { return autograd::sigmoid(v[0]); });
  check("add_broadcast trailing", {random_tensor({2, 3, 4, 5}, 43), random_tensor({4, 5}, 44)},
        [](const std::vector<Variable>& v) { return autograd::add_broadcast(v[0], v[1]); });
  check("add_broadcast both", {random_tensor({3, 2, 4, 2}, 45), random_tensor({3, 1, 4, 1}, 46)},
        [](const std::vector<Variable>& v) { return autograd::add_broadcast(v[0], v[1]); });
  check("mean_last", {random_tensor({3, 2, 7}, 40)},
        [](const std::vector<Variable>& v) { return autograd::mean_last(v[0]); });
}

TEST(SmallOpsGradcheck, NarrowConcatIndex) {
  for (int dim : {0, 1, 2, -1})
    check("narrow dim " + std::to_string(dim), {random_tensor({4, 5, 6}, 41)},
          [dim](const std::vector<Variable>& v) { return autograd::narrow(v[0], dim, 1, 3); });
  check("concat dim 1", {random_tensor({2, 3, 4}, 42), random_tensor({2, 1, 4}, 43), random_tensor({2, 2, 4}, 44)},
        [](const std::vector<Variable>& v) { return autograd::concat({v[0], v[1], v[2]}, 1); });
  check("concat last, one input twice", {random_tensor({3, 2}, 45)},
        [](const std::vector<Variable>& v) { return autograd::concat({v[0], v[0]}, -1); });
  Tensor index = Tensor::empty({7}, DType::i32);
  const int32_t rows[] = {2, 0, 2, 4, 1, 2, 0};  // repeats (sums in backward) and row 3 unused
  for (int i = 0; i < 7; ++i) index.data<int32_t>()[i] = rows[i];
  check("index_select", {random_tensor({5, 3}, 46)},
        [&](const std::vector<Variable>& v) { return autograd::index_select(v[0], index); });
  check("index_add", {random_tensor({7, 2, 3}, 47)},
        [&](const std::vector<Variable>& v) { return autograd::index_add(5, index, v[0]); });
}

TEST(SmallOpsGradcheck, MaskedFillSoftmaxLogSoftmax) {
  const Tensor same = keep_mask({2, 3, 5, 6}, 11), broadcast = keep_mask({2, 1, 5, 6}, 12);
  check("masked_fill", {random_tensor({2, 3, 5, 6}, 13)},
        [&](const std::vector<Variable>& v) { return autograd::masked_fill(v[0], same, -3.0); });
  check("masked_fill broadcast", {random_tensor({2, 3, 5, 6}, 14)},
        [&](const std::vector<Variable>& v) { return autograd::masked_fill(v[0], broadcast, 2.0); });
  check("softmax", {random_tensor({4, 9}, 15, -3, 3)},
        [](const std::vector<Variable>& v) { return autograd::softmax(v[0]); });
  check("log_softmax", {random_tensor({4, 9}, 16, -3, 3)},
        [](const std::vector<Variable>& v) { return autograd::log_softmax(v[0]); });
  // Through an -inf mask, as attention and the KL use them (masked entries are zeroed after).
  check("masked log_softmax", {random_tensor({2, 1, 5, 6}, 17, -3, 3)}, [&](const std::vector<Variable>& v) {
    const Variable l = autograd::log_softmax(autograd::masked_fill(v[0], broadcast, -INFINITY));
    return autograd::masked_fill(l, broadcast, 0.0);
  });
  check("masked softmax", {random_tensor({2, 3, 5, 6}, 18, -3, 3)}, [&](const std::vector<Variable>& v) {
    return autograd::softmax(autograd::masked_fill(v[0], broadcast, -INFINITY));
  });
}

// SwiGLU's backward writes both gradients into fresh buffers when its inputs have none yet (two
// projections), adds otherwise, and handles one variable passed as both gate and up.
TEST(SmallOpsGradcheck, SwigluFreshAndShared) {
  check("swiglu of two projections", {random_tensor({5, 6}, 23), random_tensor({7, 6}, 24), random_tensor({7, 6}, 25)},
        [](const std::vector<Variable>& v) {
          return autograd::swiglu(autograd::linear(v[0], v[1]), autograd::linear(v[0], v[2]));
        });
  check("swiglu(h, h)", {random_tensor({4, 9}, 26, -2, 2)}, [](const std::vector<Variable>& v) {
    const Variable h = autograd::scale(v[0], 1.5);
    return autograd::swiglu(h, h);
  });
  check("swiglu with a used gate", {random_tensor({4, 9}, 27, -2, 2), random_tensor({4, 9}, 28)},
        [](const std::vector<Variable>& v) {
          const Variable g = autograd::scale(v[0], 1.0);
          return autograd::mul(autograd::swiglu(g, autograd::scale(v[1], 1.0)), g);
        });
}

TEST(SmallOpsGradcheck, LayerNorm) {
  check("layernorm", {random_tensor({3, 4, 8}, 19), random_tensor({8}, 20, 0.5, 1.5), random_tensor({8}, 21)},
        [](const std::vector<Variable>& v) { return autograd::layernorm(v[0], v[1], v[2], 1e-6); });
}

TEST(SmallOps, CastPassesTheGradientBack) {
  // f32 -> bf16 -> f32: the value rounds to bf16, the gradient (identity) comes back exactly.
  Variable x(random_tensor({3, 5}, 25), true);
  Variable y = autograd::cast(autograd::cast(x, DType::bf16), DType::f32);
  EXPECT_EQ(y.dtype(), DType::f32);
  const Tensor probe = random_tensor({3, 5}, 26);
  autograd::backward(y, probe.to(DType::bf16).to(DType::f32));
  for (int64_t i = 0; i < 15; ++i) {
    EXPECT_NEAR(y.value().data<float>()[i], x.value().data<float>()[i], 4e-3);
    EXPECT_EQ(x.grad().data<float>()[i], probe.to(DType::bf16).to(DType::f32).data<float>()[i]);
  }
  EXPECT_TRUE(autograd::cast(x, DType::f32).same(x));
}

TEST(SmallOps, AllMaskedRowsGiveZerosAndNoNan) {
  Tensor keep = Tensor::zeros({1, 1, 2, 3}, DType::u8);
  keep.data<uint8_t>()[3] = keep.data<uint8_t>()[4] = 1;  // row 0 fully masked, row 1 keeps keys 0 and 1
  Variable x(random_tensor({1, 1, 2, 3}, 22), true);
  Variable ls = autograd::log_softmax(autograd::masked_fill(x, keep, -INFINITY));
  Variable loss = autograd::sum(autograd::masked_fill(ls, keep, 0.0));
  autograd::backward(loss);
  for (int64_t i = 0; i < 6; ++i) EXPECT_TRUE(std::isfinite(x.grad().data<float>()[i])) << i;
  EXPECT_EQ(x.grad().data<float>()[0], 0.0f);
  EXPECT_EQ(x.grad().data<float>()[5], 0.0f);
  EXPECT_EQ(ls.value().data<float>()[5], -INFINITY);
}
