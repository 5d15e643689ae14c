// The Tensor-level matmul API around the kernels: steady-state behaviour (no primitive creation,
// no allocation), views folded into transposes, batch collapsing, and its errors.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/kernel_check.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/onednn/matmul.h"

using namespace titan;
using namespace titan::kernels;
using titan::test::random_tensor;
using titan::test::to_doubles;

namespace {
void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(to_doubles(got), to_doubles(want));
}
}  // namespace

TEST(KernelsMatmul, SteadyStateCreatesAndAllocatesNothing) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = random_tensor({2, 64, 96}, dt, 1, "x"), w = random_tensor({160, 96}, dt, 1, "w");
    const Tensor bias = random_tensor({160}, dt, 1, "bias"), dy = random_tensor({2, 64, 160}, dt, 1, "dy");
    Tensor y = Tensor::empty({2, 64, 160}, dt), dx = Tensor::zeros({2, 64, 96}, dt);
    Tensor dw = Tensor::zeros({160, 96}, DType::f32), db = Tensor::zeros({160}, DType::f32);
    auto step = [&] {
      linear_forward(y, x, w, bias);
      linear_backward(dx, dw, db, dy, x, w);
    };
    step();  // first use: creates the primitives and the scratchpad
    const int64_t created = onednn::matmul_cache_stats().created, allocs = memory_stats().system_allocs;
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(onednn::matmul_cache_stats().created, created) << dtype_name(dt);
    EXPECT_EQ(memory_stats().system_allocs, allocs) << dtype_name(dt);
  }
  std::printf("oneDNN matmul cache: %lld primitives, scratchpad %lld bytes\n",
              (long long)onednn::matmul_cache_stats().primitives,
              (long long)onednn::matmul_cache_stats().scratchpad_bytes);
}

// A transpose() view and the same data made contiguous with the transpose flag flipped are the
// same product; the view costs no copy.
TEST(KernelsMatmul, TransposedViewsFoldIntoTheFlag) {
  const Tensor a = random_tensor({13, 7}, DType::f32, 2, "a"), b = random_tensor({13, 5}, DType::f32, 2, "b");
  Tensor via_flag = Tensor::empty({7, 5}, DType::f32), via_view = Tensor::empty({7, 5}, DType::f32);
  matmul(via_flag, a, b, /*trans_a=*/true, false);
  matmul(via_view, a.transpose(0, 1), b, false, false);
  expect_same(via_view, via_flag);
  Tensor via_contiguous = Tensor::empty({7, 5}, DType::f32);
  matmul(via_contiguous, a.transpose(0, 1).contiguous(), b, false, false);
  const auto got = to_doubles(via_view), want = to_doubles(via_contiguous);
  const auto e = test::compare(got, want, 1e-5, 1e-5);
  EXPECT_LE(e.max_scaled, 1.0);
}

// [2, 3, M, K] @ [K, N] is one collapsed batch of 6 with a shared B, and equals the same rows as
// one 2-D product; linear_forward on 3-D activations equals the flattened 2-D call.
TEST(KernelsMatmul, BatchDimsCollapseAndSharedB) {
  const Tensor a = random_tensor({2, 3, 4, 8}, DType::f32, 3, "a"), b = random_tensor({8, 5}, DType::f32, 3, "b");
  Tensor c4 = Tensor::empty({2, 3, 4, 5}, DType::f32), c2 = Tensor::empty({24, 5}, DType::f32);
  matmul(c4, a, b, false, false);
  matmul(c2, a.view({24, 8}), b, false, false);
  expect_same(c4.view({24, 5}), c2);

  // A per-batch B: batch 1 of the result equals the 2-D product of the batch-1 slices.
  const Tensor bb = random_tensor({6, 8, 5}, DType::f32, 3, "bb");
  Tensor cb = Tensor::empty({6, 4, 5}, DType::f32), one = Tensor::empty({4, 5}, DType::f32);
  matmul(cb, a.view({6, 4, 8}), bb, false, false);
  matmul(one, a.view({6, 4, 8}).select(0, 1), bb.select(0, 1), false, false);
  expect_same(cb.select(0, 1).contiguous(), one);

  // A shared 2-D A against a batched B.
  const Tensor a2 = random_tensor({4, 8}, DType::f32, 3, "a2");
  Tensor ca = Tensor::empty({6, 4, 5}, DType::f32);
  matmul(ca, a2, bb, false, false);
  matmul(one, a2, bb.select(0, 4), false, false);
  expect_same(ca.select(0, 4).contiguous(), one);

  const Tensor x = random_tensor({2, 3, 8}, DType::bf16, 3, "x"), w = random_tensor({5, 8}, DType::bf16, 3, "w");
  Tensor y3 = Tensor::empty({2, 3, 5}, DType::bf16), y2 = Tensor::empty({6, 5}, DType::bf16);
  linear_forward(y3, x, w);
  linear_forward(y2, x.view({6, 8}), w);
  expect_same(y3.view({6, 5}), y2);
}

// The raw form with a bias on a batch that cannot fold into one product (B per batch).
TEST(KernelsMatmul, RawBatchedWithBiasMatchesReference) {
  const MatmulParams p = dense_matmul_params(3, 5, 7, 33, false, true);
  const Tensor a = random_tensor({3, 5, 33}, DType::bf16, 5, "a"), b = random_tensor({3, 7, 33}, DType::bf16, 5, "b");
  const Tensor bias = random_tensor({7}, DType::f32, 5, "bias");
  Tensor fast = Tensor::empty({3, 5, 7}, DType::f32), ref = Tensor::empty({3, 5, 7}, DType::f32);
  matmul(fast.data_ptr(), DType::f32, a.data_ptr(), b.data_ptr(), DType::bf16, bias.data_ptr(), p);
  set_kernel_backend(KernelBackend::reference);
  matmul(ref.data_ptr(), DType::f32, a.data_ptr(), b.data_ptr(), DType::bf16, bias.data_ptr(), p);
  set_kernel_backend(KernelBackend::fast);
  const auto e = test::compare(to_doubles(fast), to_doubles(ref), 1e-4, 1e-5);
  EXPECT_LE(e.max_scaled, 1.0) << "max_abs " << e.max_abs;
}

TEST(KernelsMatmul, ErrorsSayWhatToDo) {
  const Tensor a = random_tensor({4, 8}, DType::f32, 4, "a"), b = random_tensor({6, 5}, DType::f32, 4, "b");
  Tensor c = Tensor::empty({4, 5}, DType::f32);
  EXPECT_THROW(matmul(c, a, b, false, false), Error);  // K mismatch: 8 vs 6
  const Tensor b16 = random_tensor({8, 5}, DType::bf16, 4, "b16");
  EXPECT_THROW(matmul(c, a, b16, false, false), Error);  // mixed input dtypes
  // Every other element of each row: no unit stride in either of the last two dims.
  const Tensor strided = random_tensor({4, 8, 2}, DType::f32, 4, "s").select(2, 0);
  EXPECT_THROW(matmul(c, strided, random_tensor({8, 5}, DType::f32, 4, "b2"), false, false), Error);
  try {
    Tensor cf = Tensor::empty({4, 5}, DType::bf16);
    matmul(cf, a, random_tensor({8, 5}, DType::f32, 4, "b3"), false, false);  // bf16 output of f32 inputs
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(KernelsMatmul, PrintsTheChosenImplementations) {
  const MatmulParams p = dense_matmul_params(1, 256, 256, 256, false, false);
  std::printf("oneDNN matmul: f32 %s, bf16 %s\n", onednn::matmul_impl_name(DType::f32, DType::f32, false, p).c_str(),
              onednn::matmul_impl_name(DType::f32, DType::bf16, false, p).c_str());
}
