// Tensor-level top-k: the ordering rules of ref/topk.h on hand-made rows (both backends).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "titan/kernels/dispatch.h"
#include "titan/kernels/topk.h"

using namespace titan;
using namespace titan::kernels;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Runs topk on one row (repeated so the radix path runs too, by padding with -inf to n >= 64 when
// pad is set) and returns the indices.
std::vector<int32_t> topk_indices(std::vector<float> row, int64_t k, bool pad) {
  if (pad) row.resize(std::max<size_t>(row.size(), 100), -kInf);
  Tensor x = Tensor::empty({1, int64_t(row.size())}, DType::f32);
  for (size_t i = 0; i < row.size(); ++i) x.data<float>()[i] = row[i];
  Tensor values = Tensor::empty({1, k}, DType::f32), indices = Tensor::empty({1, k}, DType::i32);
  topk(values, indices, x, k);
  std::vector<int32_t> out(indices.data<int32_t>(), indices.data<int32_t>() + k);
  for (int64_t j = 0; j < k; ++j) {
    const float v = values.data<float>()[j], want = row[size_t(out[size_t(j)])];
    EXPECT_TRUE(std::isnan(want) ? std::isnan(v) : v == want);
  }
  return out;
}

}  // namespace

class TopK : public ::testing::TestWithParam<std::tuple<KernelBackend, int64_t>> {
 protected:
  void SetUp() override { set_kernel_backend(std::get<0>(GetParam())); }
  void TearDown() override { set_kernel_backend(KernelBackend::fast); }
  // k padded above the small-k threshold (32) exercises the radix path.
  int64_t k(int64_t base) const { return base + std::get<1>(GetParam()); }
  bool pad() const { return std::get<1>(GetParam()) > 0; }
};

TEST_P(TopK, DescendingWithLowerIndexFirstOnTies) {
  const std::vector<int32_t> got = topk_indices({1, 3, 2, 3, 0, 3}, k(4), pad());
  const std::vector<int32_t> want = {1, 3, 5, 2};
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 4), want);
}

TEST_P(TopK, NaNRanksAboveInfinityAndZerosTie) {
  const std::vector<int32_t> got = topk_indices({0.0f, kInf, kNaN, -0.0f, 5, kNaN, -kInf}, k(6), pad());
  const std::vector<int32_t> want = {2, 5, 1, 4, 0, 3};
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 6), want);
}

TEST_P(TopK, MinusInfinityFillsTheTailInIndexOrder) {
  const std::vector<int32_t> got = topk_indices({-kInf, -1, -kInf, -kInf}, k(3), pad());
  const std::vector<int32_t> want = {1, 0, 2};
  EXPECT_EQ(std::vector<int32_t>(got.begin(), got.begin() + 3), want);
}

INSTANTIATE_TEST_SUITE_P(Backends, TopK,
                         ::testing::Combine(::testing::Values(KernelBackend::fast, KernelBackend::reference),
                                            ::testing::Values(int64_t(0), int64_t(40))));

TEST(TopKErrors, KOutsideRowIsRejected) {
  const Tensor x = Tensor::zeros({2, 5}, DType::f32);
  Tensor v = Tensor::empty({2, 6}, DType::f32), i = Tensor::empty({2, 6}, DType::i32);
  EXPECT_THROW(topk(v, i, x, 6), Error);
  Tensor v0 = Tensor::empty({2, 0}, DType::f32), i0 = Tensor::empty({2, 0}, DType::i32);
  EXPECT_THROW(topk(v0, i0, x, 0), Error);
}
