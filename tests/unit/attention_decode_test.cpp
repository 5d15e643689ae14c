#include <gtest/gtest.h>

#include "common/kernel_check.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/attention_decode.h"

using namespace titan;

// Prefill of the first P tokens then decode of the rest, one at a time, reproduces full causal
// attention over the sequence (GQA, different value width).
TEST(AttentionDecode, MatchesFullCausalAttentionRowByRow) {
  const int64_t b = 2, s = 13, h = 4, hkv = 2, dqk = 24, dv = 16;
  Tensor q = test::random_tensor({b, s, h, dqk}, DType::f32, 3, "q");
  Tensor k = test::random_tensor({b, s, hkv, dqk}, DType::f32, 3, "k");
  Tensor v = test::random_tensor({b, s, hkv, dv}, DType::f32, 3, "v");
  Tensor full = Tensor::empty({b, s, h, dv}, DType::f32), lse = Tensor::empty({b, h, s}, DType::f32);
  kernels::attention_forward(full, lse, q, k, v);
  const int64_t prefill = 5;
  Tensor pre = Tensor::empty({b, prefill, h, dv}, DType::f32);
  Tensor qp = q.slice(1, 0, prefill).contiguous();
  kernels::attention_decode(pre, qp, k, v, 0);
  for (int64_t i = 0; i < prefill; ++i)
    for (int64_t d = 0; d < dv; ++d) ASSERT_NEAR(pre.at({1, i, 3, d}), full.at({1, i, 3, d}), 1e-5);
  for (int64_t pos = prefill; pos < s; ++pos) {
    Tensor one = Tensor::empty({b, 1, h, dv}, DType::f32);
    Tensor q1 = q.slice(1, pos, pos + 1).contiguous();
    kernels::attention_decode(one, q1, k, v, pos);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hh = 0; hh < h; ++hh)
        for (int64_t d = 0; d < dv; ++d) ASSERT_NEAR(one.at({bi, 0, hh, d}), full.at({bi, pos, hh, d}), 1e-5);
  }
  Tensor bad = Tensor::empty({b, 1, h, dv}, DType::f32);
  Tensor q1 = q.slice(1, 0, 1).contiguous();
  EXPECT_THROW(kernels::attention_decode(bad, q1, k, v, s), Error);
}
