// The zero-bubble split of a backward (autograd::DeferWeightGrads), used by the pipeline
// executor's I and W actions.
#include <gtest/gtest.h>

#include "titan/autograd/ops.h"
#include "titan/autograd/variable.h"

using namespace titan;
using namespace titan::autograd;

// The zero-bubble split: inside DeferWeightGrads a backward computes the inputs' gradients and
// queues the linear layers' weight GEMMs; running the queue (W) gives the weights exactly the
// gradients one backward gives, and nothing before it. Other parameters (the norm's) are not
// deferred. Two micro-batches' queues, run in order, accumulate as two backwards do.
TEST(Autograd, DeferredWeightGradientsEqualTheWholeBackward) {
  const auto rand = [](Shape s, uint64_t seed) {
    Tensor t = Tensor::empty(s, DType::f32);
    float* d = t.data<float>();
    uint64_t x = seed;
    for (int64_t i = 0; i < t.numel(); ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL, d[i] = float((x >> 40) % 2001) / 1000.0f - 1.0f;
    return t;
  };
  Variable w1(rand({24, 16}, 1), true, "w1"), w2(rand({8, 24}, 2), true, "w2"), g(rand({24}, 3), true, "norm");
  const Tensor x0 = rand({5, 16}, 4), x1 = rand({5, 16}, 5);
  const auto loss = [&](const Tensor& x, Variable& input) {
    input = make_output(x, true);
    Variable h = rmsnorm(linear(input, w1), g, 1e-6);
    return sum(linear(h, w2));
  };
  // Whole backwards, two micro-batches.
  Tensor want_dx[2], want_w1, want_w2, want_g;
  {
    Variable in0, in1;
    Variable l0 = loss(x0, in0);
    backward(l0);
    want_dx[0] = in0.grad().clone();
    Variable l1 = loss(x1, in1);
    backward(l1);
    want_dx[1] = in1.grad().clone();
    want_w1 = w1.grad().clone(), want_w2 = w2.grad().clone(), want_g = g.grad().clone();
  }
  for (Variable* v : {&w1, &w2, &g}) v->clear_grad();
  // Deferred: I for both micro-batches, then W for both.
  WeightGradQueue q0, q1;
  Variable in0, in1;
  {
    TapeScope tape;
    Variable l0 = loss(x0, in0);
    DeferWeightGrads later(q0);
    backward(l0);
  }
  EXPECT_FALSE(w1.grad().defined()) << "w1's gradient came before its W";
  EXPECT_FALSE(w2.grad().defined());
  ASSERT_TRUE(g.grad().defined()) << "the norm's weight is not deferred";
  {
    TapeScope tape;
    Variable l1 = loss(x1, in1);
    DeferWeightGrads later(q1);
    backward(l1);
  }
  EXPECT_FALSE(q0.empty());
  q0.run();
  q1.run();
  EXPECT_TRUE(q0.empty() && q1.empty());
  const auto same = [](const Tensor& a, const Tensor& b, const char* what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], b.data<float>()[i]) << what << " at " << i;
  };
  same(want_dx[0], in0.grad(), "input 0");
  same(want_dx[1], in1.grad(), "input 1");
  same(want_w1, w1.grad(), "w1");
  same(want_w2, w2.grad(), "w2");
  same(want_g, g.grad(), "norm weight");
}
