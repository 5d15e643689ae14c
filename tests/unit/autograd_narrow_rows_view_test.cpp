// autograd::narrow_rows_view: rows of a weight as a view, for a GEMM that reads a compute copy
// (V4's grouped output projection under bf16 FSDP, where the f32 rows are not gathered).
#include <gtest/gtest.h>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"

using namespace titan;
using autograd::Variable;

// The rows are a view of x (nothing copied, so nothing of x is read), and each view's gradient
// lands in its own rows of x's: overlapping views add up, other rows stay zero.
TEST(NarrowRowsView, SharesRowsAndAddsGradientIntoThem) {
  Tensor t = Tensor::empty({3, 2}, DType::f32, MemCategory::parameters);
  for (int64_t i = 0; i < 6; ++i) t.data<float>()[i] = float(i + 1);
  Variable x(t, true);
  Variable top = autograd::narrow_rows_view(x, 0, 2), middle = autograd::narrow_rows_view(x, 1, 1);
  EXPECT_EQ(top.value().data<float>(), t.data<float>());
  EXPECT_EQ(middle.value().data<float>(), t.data<float>() + 2);
  ASSERT_EQ(middle.shape(), Shape({1, 2}));
  // L = sum(top^2) + sum(middle): d/dx = 2x on rows 0 and 1, + 1 on row 1
  Variable loss = autograd::add(autograd::sum(autograd::mul(top, top)), autograd::sum(middle));
  autograd::backward(loss);
  const float expected[6] = {2, 4, 6 + 1, 8 + 1, 0, 0};
  for (int64_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(x.grad().data<float>()[i], expected[i]) << i;
  EXPECT_THROW(autograd::narrow_rows_view(x, 2, 2), Error) << "rows past the end";
}
