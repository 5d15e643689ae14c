#include <gtest/gtest.h>

#include "titan/core/tensor.h"

using namespace titan;

namespace {
Tensor arange(int64_t n, DType dt = DType::f32) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = float(i);
  return dt == DType::f32 ? t : t.to(dt);
}
}  // namespace

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(24).view({2, 3, 4});
  EXPECT_EQ(t.strides(), Shape({12, 4, 1}));
  Tensor s = t.slice(1, 1, 3);  // [2, 2, 4]
  EXPECT_EQ(s.shape(), Shape({2, 2, 4}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(s.at({1, 0, 2}), 12 + 4 + 2);
  Tensor tr = t.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(tr.at({3, 2, 1}), 12 + 8 + 3);
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_EQ(c.at({3, 2, 1}), 23);
  Tensor sel = t.select(0, 1).select(-1, 3);  // [3]
  EXPECT_EQ(sel.shape(), Shape({3}));
  EXPECT_EQ(sel.at({2}), 12 + 8 + 3);
  s.fill_(-1);  // writes through the view
  EXPECT_EQ(t.at({0, 1, 0}), -1);
  EXPECT_EQ(t.at({0, 0, 0}), 0);
  EXPECT_EQ(t.view({-1, 4}).shape(), Shape({6, 4}));
  EXPECT_THROW(t.view({5, -1}), Error);
  EXPECT_THROW(tr.view({24}), Error);
  EXPECT_EQ(tr.reshape({24}).at({1}), 12);
  EXPECT_THROW(t.slice(0, 1, 3), Error);
  EXPECT_EQ(t.permute({2, 0, 1}).shape(), Shape({4, 2, 3}));
  EXPECT_EQ(t.unsqueeze(1).shape(), Shape({2, 1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).strides(), t.strides());
}

TEST(Tensor, CopyConvertsAcrossStridesAndDtypes) {
  Tensor a = arange(12).view({3, 4});
  Tensor b = Tensor::zeros({4, 3}, DType::bf16);
  b.copy_(a.transpose(0, 1));
  EXPECT_EQ(b.at({2, 1}), 6);
  Tensor c = Tensor::zeros({4, 6}, DType::f32);
  c.slice(1, 1, 4).copy_(b);  // strided destination
  EXPECT_EQ(c.at({3, 3}), 11);
  EXPECT_EQ(c.at({3, 0}), 0);
  Tensor q = arange(8).to(DType::f4e2m1);
  EXPECT_EQ(q.nbytes(), 4u);
  EXPECT_EQ(q.at({5}), 4);  // 5 rounds to 4 (tie between 4 and 6 goes to even)
  EXPECT_EQ(Tensor::full({2}, 3.5, DType::i64).at({1}), 4);
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t = Tensor::zeros({4}, DType::bf16);
  EXPECT_NO_THROW(t.data<bf16>());
  EXPECT_THROW(t.data<float>(), Error);
  EXPECT_THROW(Tensor().data_ptr(), Error);
}

TEST(Tensor, AllocatorCountsLiveAndPeakPerCategory) {
  memory_reset_peak();
  const MemoryStats before = memory_stats();
  const int p = int(MemCategory::parameters), g = int(MemCategory::gradients);
  {
    Tensor w = Tensor::empty({1024}, DType::f32, MemCategory::parameters);
    Tensor dw = Tensor::empty({1024}, DType::f32, MemCategory::gradients);
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.live[p] - before.live[p], 4096);
    EXPECT_EQ(during.live[g] - before.live[g], 4096);
    Tensor view = w.slice(0, 0, 10);  // views allocate nothing
    EXPECT_EQ(memory_stats().live_total, during.live_total);
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.live[p], before.live[p]);
  EXPECT_EQ(after.peak[p] - before.live[p], 4096);
  EXPECT_GE(after.peak_total - before.live_total, 8192);
}

TEST(Tensor, SteadyStateReusesCachedBlocks) {
  const bool was_enabled = memory_cache_enabled();
  memory_set_cache_enabled(true);
  auto step = [] {
    Tensor a = Tensor::empty({333, 77}, DType::f32, MemCategory::activations);
    Tensor b = Tensor::empty({1000}, DType::bf16, MemCategory::temporaries);
  };
  step();
  const int64_t allocs = memory_stats().system_allocs;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(memory_stats().system_allocs, allocs);
  memory_set_cache_enabled(was_enabled);
}
