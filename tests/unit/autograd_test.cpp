#include <gtest/gtest.h>

#include <cmath>

#include "titan/autograd/variable.h"

using namespace titan;
using namespace titan::autograd;

namespace {

// Small element-wise ops (f32) written here so the engine is tested independently of kernels.
Tensor like(const Tensor& t) { return Tensor::empty(t.shape(), DType::f32, MemCategory::activations); }

Variable mul(const Variable& a, const Variable& b) {
  Tensor y = like(a.value());
  const float *pa = a.value().data<float>(), *pb = b.value().data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = pa[i] * pb[i];
  return record("mul", {a, b}, y, [av = a.value(), bv = b.value()](const Tensor& dy, GradSink& g) {
    for (size_t k = 0; k < 2; ++k) {
      if (!g.needs(k)) continue;
      Tensor d = g.grad(k);
      const float* other = (k == 0 ? bv : av).data<float>();
      for (int64_t i = 0; i < d.numel(); ++i) d.data<float>()[i] += dy.data<float>()[i] * other[i];
    }
  });
}

Variable sin_(const Variable& a) {
  Tensor y = like(a.value());
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = std::sin(a.value().data<float>()[i]);
  return record("sin", {a}, y, [av = a.value()](const Tensor& dy, GradSink& g) {
    Tensor d = g.grad(0);
    for (int64_t i = 0; i < d.numel(); ++i) d.data<float>()[i] += dy.data<float>()[i] * std::cos(av.data<float>()[i]);
  });
}

Variable sum(const Variable& a) {
  double s = 0;
  for (int64_t i = 0; i < a.value().numel(); ++i) s += a.value().data<float>()[i];
  return record("sum", {a}, Tensor::full({1}, s, DType::f32), [](const Tensor& dy, GradSink& g) {
    Tensor d = g.grad(0);
    for (int64_t i = 0; i < d.numel(); ++i) d.data<float>()[i] += dy.data<float>()[0];
  });
}

// y = a * 3, whose backward writes a's gradient outright when it is stale (grad_to_write).
Variable triple_writing(const Variable& a) {
  Tensor y = like(a.value());
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = 3 * a.value().data<float>()[i];
  return record("triple", {a}, y, [](const Tensor& dy, GradSink& g) {
    bool accumulate = true;
    Tensor d = g.grad_to_write(0, &accumulate);
    for (int64_t i = 0; i < d.numel(); ++i) {
      d.data<float>()[i] = (accumulate ? d.data<float>()[i] : 0.0f) + 3 * dy.data<float>()[i];
    }
  });
}

Variable param(std::initializer_list<float> v) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::f32, MemCategory::parameters);
  int i = 0;
  for (float x : v) t.data<float>()[i++] = x;
  return Variable(t, true);
}

}  // namespace

TEST(Autograd, ChainAndFanOut) {
  Variable a = param({0.5f, -1.0f, 2.0f}), b = param({3.0f, 0.25f, -2.0f});
  // L = sum(a*b + sin(a*b) * a): a is used three times, a*b twice.
  Variable ab = mul(a, b);
  Variable l = sum(mul(sin_(ab), a));
  Variable l2 = sum(ab);
  backward(l);  // runs the whole tape, seeding l only: l2's branch gets no gradient
  for (int i = 0; i < 3; ++i) {
    const double av = a.value().at({i}), bv = b.value().at({i}), x = av * bv;
    EXPECT_NEAR(a.grad().at({i}), std::cos(x) * bv * av + std::sin(x), 1e-6);
    EXPECT_NEAR(b.grad().at({i}), std::cos(x) * av * av, 1e-6);
  }
  EXPECT_EQ(current_tape().size(), 0u);
  EXPECT_FALSE(ab.grad().defined()) << "intermediate gradients are released after use";
  (void)l2;
}

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Variable a = param({1.0f, 2.0f});
  for (int micro = 0; micro < 3; ++micro) {
    Variable l = sum(mul(a, a));
    backward(l);
  }
  EXPECT_FLOAT_EQ(a.grad().at({1}), 3 * 2 * 2.0f);
  a.zero_grad();
  EXPECT_EQ(a.grad().at({1}), 0.0f);
}

// zero_grad() keeps the buffer unwritten: readers see zeros, a writing backward overwrites it
// (its stale contents must not leak in), an adding one adds to zeros, and a second backward in
// the same step adds to what the first wrote.
TEST(Autograd, ZeroGradIsLazyAndExact) {
  Variable a = param({1.0f, 2.0f});
  { Variable l = sum(mul(a, a)); backward(l); }  // gradient 2a = {2, 4}
  const float* buffer = a.grad().data<float>();
  a.zero_grad();
  EXPECT_EQ(a.slot()->grad.data<float>()[1], 4.0f) << "zero_grad no longer writes the buffer";
  { Variable l = sum(triple_writing(a)); backward(l); }  // writes 3, not 4 + 3
  EXPECT_EQ(a.grad().at({1}), 3.0f);
  EXPECT_EQ(a.grad().data<float>(), buffer) << "into the same buffer";
  { Variable l = sum(triple_writing(a)); backward(l); }  // a second micro-batch adds
  EXPECT_EQ(a.grad().at({1}), 6.0f);

  a.zero_grad();
  EXPECT_EQ(a.grad().at({1}), 0.0f) << "a reader sees zeros";
  a.zero_grad();
  { Variable l = sum(mul(a, a)); backward(l); }  // a kernel that only adds gets a zero-filled buffer
  EXPECT_EQ(a.grad().at({1}), 4.0f);
  a.zero_grad();
  { Variable l = sum(mul(a, triple_writing(a))); backward(l); }  // both uses in one backward: d(3a^2) = 6a
  EXPECT_EQ(a.grad().at({1}), 12.0f);
}

// A gradient that does not exist yet is handed to a writing backward uninitialized (no
// zero-fill, grad_to_write): the writer must overwrite every element, and a use that adds in the
// same backward adds to what it wrote. Poisoned blocks in the allocation cache make a skipped
// element show.
TEST(Autograd, FirstGradientIsWrittenNotZeroFilled) {
  for (int i = 0; i < 8; ++i) {  // freed at once: the cache hands these blocks out next
    Tensor poison = Tensor::full({2}, std::nan(""), DType::f32, MemCategory::gradients);
  }
  Variable a = param({1.0f, 2.0f});
  { Variable l = sum(triple_writing(a)); backward(l); }  // a leaf's first gradient: written
  EXPECT_EQ(a.grad().at({0}), 3.0f);
  EXPECT_EQ(a.grad().at({1}), 3.0f);
  Variable b = param({1.0f, 2.0f});
  { Variable l = sum(mul(b, triple_writing(b))); backward(l); }  // written, then added: 6b
  EXPECT_EQ(b.grad().at({0}), 6.0f);
  EXPECT_EQ(b.grad().at({1}), 12.0f);
  Variable c = param({1.0f, 2.0f});
  { Variable l = sum(triple_writing(mul(c, c))); backward(l); }  // an intermediate's: 3 * 2c
  EXPECT_EQ(c.grad().at({0}), 6.0f);
  EXPECT_EQ(c.grad().at({1}), 12.0f);
}

TEST(Autograd, NoGradRecordsNothing) {
  Variable a = param({1.0f});
  {
    NoGradGuard guard;
    Variable y = mul(a, a);
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(current_tape().size(), 0u);
  Variable c(Tensor::full({1}, 2.0, DType::f32), false);
  EXPECT_FALSE(mul(c, c).requires_grad());
  EXPECT_EQ(current_tape().size(), 0u);
  Variable y = sum(c);
  EXPECT_THROW(backward(y), Error);
}

TEST(Autograd, CheckpointMatchesAndSavesActivationMemory) {
  const int64_t n = 1 << 16;
  Tensor init = Tensor::empty({n}, DType::f32, MemCategory::parameters);
  for (int64_t i = 0; i < n; ++i) init.data<float>()[i] = 0.001f * float(i % 1000);
  auto block = [](const std::vector<Variable>& in) {
    Variable x = in[0];
    for (int i = 0; i < 8; ++i) x = sin_(x);  // 8 saved activations inside the region
    return std::vector<Variable>{x};
  };
  const int act = int(MemCategory::activations);
  auto run = [&](bool use_checkpoint, int64_t& peak_activations) {
    Variable w(init.clone(MemCategory::parameters), true);
    memory_reset_peak();
    const int64_t base = memory_stats().live[act];
    Variable h = use_checkpoint ? checkpoint(block, {w})[0] : block({w})[0];
    Variable l = sum(h);
    peak_activations = memory_stats().peak[act] - base;
    backward(l);
    return w.grad().clone();
  };
  int64_t peak_plain = 0, peak_ckpt = 0;
  Tensor g_plain = run(false, peak_plain);
  Tensor g_ckpt = run(true, peak_ckpt);
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(g_plain.at({i}), g_ckpt.at({i}));
  EXPECT_LE(peak_ckpt * 4, peak_plain) << "checkpointing keeps only the region's output";
}

// Selective checkpointing: the outputs of ops that go through keep_or_compute (here a counted
// "expensive" op) are kept by the first pass and reused by the recompute; everything else is
// recomputed. Gradients are the same as with no checkpointing or full recompute.
TEST(Autograd, SelectiveCheckpointReusesExpensiveOutputs) {
  int computed = 0;
  auto expensive = [&computed](const Variable& a) {  // y = 3 a
    const Tensor y = keep_or_compute([&] {
      ++computed;
      Tensor t = like(a.value());
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = 3 * a.value().data<float>()[i];
      return std::vector<Tensor>{t};
    })[0];
    return record("times3", {a}, y, [](const Tensor& dy, GradSink& g) {
      Tensor d = g.grad(0);
      for (int64_t i = 0; i < d.numel(); ++i) d.data<float>()[i] += 3 * dy.data<float>()[i];
    });
  };
  auto region = [&](const std::vector<Variable>& in) {
    return std::vector<Variable>{sin_(expensive(sin_(expensive(in[0]))))};
  };
  std::vector<std::vector<float>> grads;
  std::vector<int> counts;
  for (int mode = 0; mode < 3; ++mode) {
    Variable w(Tensor::full({5}, 0.3, DType::f32, MemCategory::parameters), true);
    computed = 0;
    Variable y = mode == 0 ? region({w})[0]
                           : checkpoint(region, {w}, mode == 1 ? CheckpointPolicy::recompute_all
                                                               : CheckpointPolicy::save_expensive)[0];
    Variable l = sum(y);
    backward(l);
    counts.push_back(computed);
    grads.emplace_back(w.grad().data<float>(), w.grad().data<float>() + 5);
  }
  EXPECT_EQ(counts, (std::vector<int>{2, 4, 2}));  // plain, full (twice), selective (once)
  EXPECT_EQ(grads[1], grads[0]);
  EXPECT_EQ(grads[2], grads[0]);
  EXPECT_NEAR(grads[0][0], 9 * std::cos(3 * std::sin(0.9f)) * std::cos(0.9f), 1e-5);
}

// A region whose input needs no gradient (e.g. after a frozen embedding) still trains the weights
// it captures; its first pass runs without grad but says it is a training forward.
TEST(Autograd, CheckpointTrainsCapturedWeightsOfAFrozenInput) {
  Variable w(Tensor::full({3}, 0.5, DType::f32, MemCategory::parameters), true);
  Variable x(Tensor::full({3}, 2.0, DType::f32), false);
  std::vector<bool> training_pass;
  auto region = [&](const std::vector<Variable>& in) {
    training_pass.push_back(in_checkpointed_forward());
    return std::vector<Variable>{mul(in[0], w)};
  };
  EXPECT_FALSE(in_checkpointed_forward());
  Variable y = sum(checkpoint(region, {x})[0]);
  EXPECT_FALSE(in_checkpointed_forward());
  ASSERT_TRUE(y.requires_grad());
  backward(y);
  ASSERT_TRUE(w.grad().defined());
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(w.grad().at({i}), 2.0);
  EXPECT_EQ(training_pass, (std::vector<bool>{true, false}));  // the first pass, then the recompute
  {
    NoGradGuard no_grad;  // evaluation: not a training forward, nothing recorded
    EXPECT_FALSE(checkpoint(region, {x})[0].requires_grad());
  }
  EXPECT_EQ(training_pass.back(), false);
}
