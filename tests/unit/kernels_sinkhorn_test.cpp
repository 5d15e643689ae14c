// mHC's Sinkhorn projection (kernels/sinkhorn.h) against what it is for: after V4's 20 iterations
// every matrix is doubly stochastic to within eps effects (it ends on a column step, so columns
// sum to 1 and rows nearly so), one iteration is a row softmax then a column normalisation, and
// the autograd op's gradient is the kernel's.
#include <gtest/gtest.h>

#include <cmath>

#include "titan/autograd/ops.h"
#include "titan/autograd/variable.h"
#include "titan/core/rng.h"
#include "titan/kernels/sinkhorn.h"

using namespace titan;

namespace {

Tensor random_logits(int64_t tokens, int64_t n, float scale) {
  Tensor l = Tensor::empty({tokens, n, n}, DType::f32);
  Generator g(7, "sinkhorn");
  for (int64_t i = 0; i < l.numel(); ++i) l.data<float>()[i] = scale * float(2 * g.next_uniform() - 1);
  return l;
}

}  // namespace

TEST(Sinkhorn, TwentyIterationsMakeEachMatrixDoublyStochastic) {
  const int64_t tokens = 37, n = 4;
  const Tensor l = random_logits(tokens, n, 1);  // mHC's logits at init are small (mix x scale + base)
  Tensor p = Tensor::empty(l.shape(), DType::f32);
  kernels::sinkhorn_forward(p, l, 20, 1e-6);
  double worst_col = 0, worst_row = 0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t a = 0; a < n; ++a) {
      double row = 0, col = 0;
      for (int64_t b = 0; b < n; ++b) {
        const float* m = p.data<float>() + t * n * n;
        EXPECT_GT(m[a * n + b], 0);
        row += m[a * n + b], col += m[b * n + a];
      }
      worst_row = std::max(worst_row, std::fabs(row - 1)), worst_col = std::max(worst_col, std::fabs(col - 1));
    }
  EXPECT_LT(worst_col, 1e-5);
  EXPECT_LT(worst_row, 1e-3) << "20 alternations leave the rows this close";
}

TEST(Sinkhorn, OneIterationIsASoftmaxThenAColumnNormalisation) {
  const int64_t n = 3;
  const Tensor l = random_logits(1, n, 2);
  Tensor p = Tensor::empty(l.shape(), DType::f32);
  kernels::sinkhorn_forward(p, l, 1, 0.0);
  double q[3][3], col[3] = {0, 0, 0};
  for (int64_t j = 0; j < n; ++j) {
    double s = 0;
    for (int64_t k = 0; k < n; ++k) s += std::exp(double(l.data<float>()[j * n + k]));
    for (int64_t k = 0; k < n; ++k) q[j][k] = std::exp(double(l.data<float>()[j * n + k])) / s, col[k] += q[j][k];
  }
  for (int64_t j = 0; j < n; ++j)
    for (int64_t k = 0; k < n; ++k) EXPECT_NEAR(p.data<float>()[j * n + k], q[j][k] / col[k], 1e-6);
}

TEST(Sinkhorn, AutogradOpGradientIsTheKernels) {
  const Tensor l = random_logits(20, 4, 3);
  autograd::Variable x(l.clone(), true);
  autograd::Variable y = autograd::sinkhorn(x, 20, 1e-6);
  const Tensor dp = random_logits(20, 4, 1);
  autograd::Variable loss = autograd::sum(autograd::mul(y, autograd::Variable(dp)));
  autograd::backward(loss);
  Tensor expect = Tensor::zeros(l.shape(), DType::f32);
  kernels::sinkhorn_backward(expect, dp, l, 20, 1e-6);
  for (int64_t i = 0; i < l.numel(); ++i) EXPECT_FLOAT_EQ(x.grad().data<float>()[i], expect.data<float>()[i]);
}
