// Tensor-level cross-entropy against an independent double formula: mean over valid tokens with
// ignore_index, the mean's gradient (also in place), and errors for bad targets.
#include <gtest/gtest.h>

#include <cmath>

#include "common/kernel_check.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/dispatch.h"

using namespace titan;
using namespace titan::kernels;

namespace {
Tensor targets_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}
}  // namespace

class CrossEntropy : public ::testing::TestWithParam<std::tuple<KernelBackend, DType>> {
 protected:
  void SetUp() override { set_kernel_backend(std::get<0>(GetParam())); }
  void TearDown() override { set_kernel_backend(KernelBackend::fast); }
};

TEST_P(CrossEntropy, MeanAndGradientMatchDoubleFormula) {
  const DType dtype = std::get<1>(GetParam());
  const int64_t n = 6, v = 5000;
  const std::vector<int32_t> t = {7, kIgnoreIndex, 4999, 0, kIgnoreIndex, 123};
  const Tensor logits = test::random_tensor({n, v}, dtype, 5, "logits", -6, 6);
  const std::vector<double> x = test::to_doubles(logits);
  // Independent: softmax in double with the max subtracted.
  std::vector<double> lse(size_t(n), 0.0);
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[size_t(r)] == kIgnoreIndex) continue;
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < v; ++j) m = std::max(m, x[size_t(r * v + j)]);
    for (int64_t j = 0; j < v; ++j) s += std::exp(x[size_t(r * v + j)] - m);
    lse[size_t(r)] = m + std::log(s);
    sum += lse[size_t(r)] - x[size_t(r * v + t[size_t(r)])];
  }
  Tensor loss = Tensor::empty({n}, DType::f32), lse_t = Tensor::empty({n}, DType::f32);
  const CrossEntropyResult res = cross_entropy_forward(loss, lse_t, logits, targets_tensor(t));
  EXPECT_EQ(res.valid, 4);
  EXPECT_NEAR(res.mean_loss, sum / 4, 1e-4);
  EXPECT_EQ(loss.data<float>()[1], 0.0f);

  const double dmean = 2.0;
  Tensor dlogits = Tensor::empty({n, v}, dtype);
  cross_entropy_mean_backward(dlogits, logits, targets_tensor(t), lse_t, dmean);
  Tensor in_place = logits.clone();
  cross_entropy_mean_backward(in_place, in_place, targets_tensor(t), lse_t, dmean);
  std::vector<double> want(size_t(n * v), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    if (t[size_t(r)] == kIgnoreIndex) continue;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(x[size_t(r * v + j)] - lse[size_t(r)]);
      want[size_t(r * v + j)] = (p - (j == t[size_t(r)] ? 1.0 : 0.0)) * dmean / 4;
    }
  }
  const double atol = dtype == DType::f32 ? 1e-7 : 1e-4, rtol = dtype == DType::f32 ? 1e-4 : 1e-2;
  for (const Tensor& g : {dlogits, in_place}) {
    const test::ErrorStats e = test::compare(test::to_doubles(g), want, atol, rtol);
    EXPECT_LE(e.max_scaled, 1.0) << "max_abs " << e.max_abs << " at " << e.worst;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CrossEntropy,
                         ::testing::Combine(::testing::Values(KernelBackend::fast, KernelBackend::reference),
                                            ::testing::Values(DType::f32, DType::bf16)));

TEST(CrossEntropyErrors, TargetOutsideVocabularyNamesRowAndTarget) {
  const Tensor logits = Tensor::zeros({3, 10}, DType::f32);
  Tensor loss = Tensor::empty({3}, DType::f32), lse = Tensor::empty({3}, DType::f32);
  try {
    cross_entropy_forward(loss, lse, logits, targets_tensor({1, 10, kIgnoreIndex}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("target 10 of row 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cross_entropy_forward(loss, lse, logits, targets_tensor({1, -1, 2})), Error);
}

TEST(CrossEntropyErrors, AllIgnoredGivesZeroMeanAndZeroGradient) {
  const Tensor logits = test::random_tensor({2, 9}, DType::f32, 1, "logits");
  const Tensor t = targets_tensor({kIgnoreIndex, kIgnoreIndex});
  Tensor loss = Tensor::empty({2}, DType::f32), lse = Tensor::empty({2}, DType::f32);
  EXPECT_EQ(cross_entropy_forward(loss, lse, logits, t).mean_loss, 0.0);
  Tensor d = Tensor::full({2, 9}, 7.0, DType::f32);
  cross_entropy_mean_backward(d, logits, t, lse, 1.0);
  for (double g : test::to_doubles(d)) EXPECT_EQ(g, 0.0);
}
