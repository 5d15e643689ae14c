// autograd::half_linear (fp16 mixed precision): each GEMM reads its operands rounded to f16 and
// the forward's product is rounded to f16, checked against plain f32 GEMMs of f16-rounded values
// (the reference twin, kernels::linear_*) on an awkward shape; an f16 overflow becomes infinity.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/random_tensor.h"
#include "titan/autograd/half_linear.h"
#include "titan/autograd/ops.h"
#include "titan/core/rng.h"
#include "titan/kernels/matmul.h"

using namespace titan;
using autograd::Variable;

namespace {

Tensor normal(const Shape& shape, uint64_t seed, double std = 1) { return test::normal(shape, seed, "half_linear", std); }

void expect_equal(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  for (int64_t i = 0; i < a.numel(); ++i)
    ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << what << " at " << i;
}

}  // namespace

TEST(HalfLinear, EveryGemmReadsF16RoundedOperands) {
  // 3 x 5 tokens, K = 37, M = 11: no dimension a multiple of a vector width.
  const Tensor x = normal({3, 5, 37}, 1), w = normal({11, 37}, 2, 0.2), dy = normal({3, 5, 11}, 3, 1e-3);
  Variable xv(x.clone(), true), wv(w.clone(), true);
  Variable y = autograd::half_linear(xv, wv, w.to(DType::f16));
  autograd::backward(y, dy);

  const Tensor x16 = autograd::round_to_f16(x), w16 = autograd::round_to_f16(w), dy16 = autograd::round_to_f16(dy);
  Tensor want_y = Tensor::empty({3, 5, 11}, DType::f32);
  kernels::linear_forward(want_y, x16, w16);
  expect_equal(y.value(), autograd::round_to_f16(want_y), "y");
  Tensor want_dx = Tensor::zeros({3, 5, 37}, DType::f32), want_dw = Tensor::zeros({11, 37}, DType::f32), none;
  kernels::linear_backward(want_dx, want_dw, none, dy16, x16, w16, false, false);
  expect_equal(xv.grad(), want_dx, "dx");
  expect_equal(wv.grad(), want_dw, "dw");
  // The rounding is real: f16 keeps 11 significant bits, so the product differs from f32's.
  Tensor y32 = Tensor::empty({3, 5, 11}, DType::f32);
  kernels::linear_forward(y32, x, w);
  bool differs = false;
  for (int64_t i = 0; i < y32.numel(); ++i) differs |= y32.data<float>()[i] != y.value().data<float>()[i];
  EXPECT_TRUE(differs);
}

TEST(HalfLinear, AnOverflowBecomesInfinity) {
  // 300 x 300 = 90000 > 65504, f16's largest value: the loss scaler must see it.
  Tensor x = Tensor::full({1, 1}, 300.0, DType::f32), w = Tensor::full({1, 1}, 300.0, DType::f32);
  const Variable y = autograd::half_linear(Variable(x, false), Variable(w, false), w.to(DType::f16));
  EXPECT_EQ(y.value().data<float>()[0], std::numeric_limits<float>::infinity());
}
