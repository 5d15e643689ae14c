// Tensor-level gather / scatter-add / embedding: errors that name the bad index, MoE-style
// permute-then-combine round trip, and determinism of the scatter-add across thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include "common/kernel_check.h"
#include "titan/kernels/embedding.h"
#include "titan/kernels/gather.h"

using namespace titan;
using namespace titan::kernels;

namespace {
Tensor ids_tensor(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  for (size_t i = 0; i < v.size(); ++i) t.data<int32_t>()[i] = v[i];
  return t;
}
}  // namespace

TEST(Embedding, BadIdNamesIdPositionAndVocab) {
  const Tensor table = Tensor::zeros({10, 4}, DType::f32);
  Tensor y = Tensor::empty({3, 4}, DType::bf16);
  try {
    embedding_forward(y, table, ids_tensor({1, 10, 2}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("token id 10 at position 1 is outside the vocabulary [0, 10)"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("vocab_size"), std::string::npos);
  }
  EXPECT_THROW(embedding_forward(y, table, ids_tensor({1, -1, 2})), Error);
}

TEST(Embedding, ForwardGathersAndBackwardSumsRepeatedIds) {
  const Tensor table = test::random_tensor({6, 5}, DType::f32, 1, "table");
  const Tensor ids = ids_tensor({4, 0, 4, 4});
  Tensor y = Tensor::empty({2, 2, 5}, DType::f32);
  embedding_forward(y, table, ids.view({2, 2}));
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(y.at({1, 0, j}), table.at({4, j}));
  Tensor dtable = Tensor::zeros({6, 5}, DType::f32);
  embedding_backward(dtable, Tensor::full({2, 2, 5}, 0.5, DType::f32), ids.view({2, 2}));
  EXPECT_EQ(dtable.at({4, 3}), 1.5);
  EXPECT_EQ(dtable.at({0, 3}), 0.5);
  EXPECT_EQ(dtable.at({1, 3}), 0.0);
}

// MoE shape: each of N tokens goes to K experts; permute = gather, combine = weighted scatter-add.
// With weights summing to 1 per token, combine(permute(x)) = x.
TEST(GatherRows, PermuteThenCombineIsIdentity) {
  const int64_t n = 37, k = 3, d = 20;
  const Tensor x = test::random_tensor({n, d}, DType::f32, 2, "x");
  std::vector<int32_t> token_of;
  for (int64_t e = 0; e < k; ++e)
    for (int64_t t = n - 1; t >= 0; --t) token_of.push_back(int32_t(t));  // expert-major, reversed
  const Tensor idx = ids_tensor(token_of);
  Tensor w = Tensor::full({n * k}, 1.0 / 3, DType::f32);
  Tensor permuted = Tensor::empty({n * k, d}, DType::f32);
  gather_rows_forward(permuted, x, idx);
  Tensor y = Tensor::zeros({n, d}, DType::f32);
  scatter_add_rows_forward(y, permuted, idx, w);
  const test::ErrorStats e = test::compare(test::to_doubles(y), test::to_doubles(x), 1e-6, 1e-6);
  EXPECT_LE(e.max_scaled, 1.0);
}

TEST(GatherRows, ScatterAddIsBitIdenticalForAnyThreadCount) {
  const int64_t r = 50, m = 4000, d = 33;
  const Tensor x = test::random_tensor({m, d}, DType::bf16, 3, "x");
  const Tensor w = test::random_tensor({m}, DType::f32, 3, "w");
  std::vector<int32_t> v(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) v[size_t(i)] = int32_t((i * 7919) % r);
  const Tensor idx = ids_tensor(v);
  const int saved = omp_get_max_threads();
  std::vector<double> first;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    Tensor y = Tensor::zeros({r, d}, DType::bf16);
    scatter_add_rows_forward(y, x, idx, w);
    Tensor dx = Tensor::zeros({r, d}, DType::bf16), dw = Tensor::zeros({m}, DType::f32);
    gather_rows_backward(dx, dw, x, y, idx, w);
    std::vector<double> all = test::to_doubles(y), more = test::to_doubles(dx), dwv = test::to_doubles(dw);
    all.insert(all.end(), more.begin(), more.end());
    all.insert(all.end(), dwv.begin(), dwv.end());
    if (first.empty()) {
      first = all;
    } else {
      EXPECT_EQ(all, first) << threads << " threads";
    }
  }
  omp_set_num_threads(saved);
}

TEST(GatherRows, BadIndexAndMissingWeightsAreRejected) {
  const Tensor x = Tensor::zeros({4, 2}, DType::f32);
  Tensor y = Tensor::empty({2, 2}, DType::f32);
  EXPECT_THROW(gather_rows_forward(y, x, ids_tensor({0, 4})), Error);
  Tensor no_dx, dw = Tensor::zeros({2}, DType::f32);
  EXPECT_THROW(gather_rows_backward(no_dx, dw, y, x, ids_tensor({0, 1})), Error);  // dw without w
}
