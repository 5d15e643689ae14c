// Muon (optim/muon.h) against torch.optim.Muon (tests/fixtures/muon_golden.safetensors, made by
// reference/muon_fixture.py with torch's Newton-Schulz iteration run in f32): four steps on tall,
// wide, 1 x n, square and larger matrices under two configurations (Nesterov with the original
// lr rule; plain momentum with match_rms_adamw), every step's parameters and the final momentum
// to 1e-6 relative (Frobenius norm of the difference over the tensor's); the iteration alone too; and what a Newton-Schulz output is for (singular
// values pulled into about (0.5, 1.5), orthogonal rows for a wide matrix's converged form).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "titan/checkpoint/safetensors.h"
#include "titan/core/rng.h"
#include "titan/kernels/matmul.h"
#include "titan/optim/muon.h"

using namespace titan;

namespace {

constexpr const char* kFixture = "tests/fixtures/muon_golden.safetensors";
constexpr int kShapes = 5, kSteps = 4;

// ||a - b|| / ||b|| (Frobenius): the relative error of the tensor as a whole.
double rel_error(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = double(a.data<float>()[i]) - double(b.data<float>()[i]);
    diff += d * d, norm += double(b.data<float>()[i]) * double(b.data<float>()[i]);
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

}  // namespace

TEST(Muon, NewtonSchulzMatchesTorch) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  for (int i = 0; i < kShapes; ++i) {
    Tensor x = golden.get("ns" + std::to_string(i) + ".in").clone();
    optim::newton_schulz(x, optim::MuonConfig{});
    const double err = rel_error(x, golden.get("ns" + std::to_string(i) + ".out"));
    std::printf("newton_schulz shape %d: relative error %.2e\n", i, err);
    // Two f32 iterations differ by rounding (GEMM summation orders), which the quintic's slope at
    // zero (a = 3.4445 per step, ~485 over five) amplifies along the small singular directions:
    // measured up to 1.3e-6 on these shapes (single elements up to 9e-5 of themselves).
    EXPECT_LT(err, 1e-5) << "shape " << i;
  }
}

TEST(Muon, StepsMatchTorchOptimMuon) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  struct Config {
    double lr, wd, momentum;
    bool nesterov;
    optim::MuonLrAdjust adjust;
  };
  const Config configs[] = {{0.02, 0.1, 0.95, true, optim::MuonLrAdjust::original},
                            {0.01, 0.01, 0.9, false, optim::MuonLrAdjust::match_rms_adamw}};
  for (int c = 0; c < 2; ++c) {
    const std::string pre = "c" + std::to_string(c) + ".p";
    std::vector<autograd::Variable> vars;
    std::vector<nn::TrainableParam> params;
    for (int i = 0; i < kShapes; ++i) {
      vars.emplace_back(golden.get(pre + std::to_string(i) + ".init").clone(), true, "p" + std::to_string(i));
      nn::TrainableParam p;
      p.name = "p" + std::to_string(i);
      p.var = vars.back();
      params.push_back(p);
    }
    optim::MuonConfig cfg;
    cfg.momentum = configs[c].momentum, cfg.nesterov = configs[c].nesterov, cfg.weight_decay = configs[c].wd;
    cfg.adjust = configs[c].adjust;
    optim::Muon opt(params, cfg);
    for (int step = 0; step < kSteps; ++step) {
      for (int i = 0; i < kShapes; ++i) vars[size_t(i)].ensure_grad().copy_(golden.get(pre + std::to_string(i) + ".grad" + std::to_string(step)).clone());
      opt.step(float(configs[c].lr));
      for (int i = 0; i < kShapes; ++i)
        EXPECT_LT(rel_error(vars[size_t(i)].value(), golden.get(pre + std::to_string(i) + ".step" + std::to_string(step))), 1e-6)
            << "config " << c << " shape " << i << " step " << step;
    }
    const auto state = opt.state_dict();
    for (int i = 0; i < kShapes; ++i)
      EXPECT_LT(rel_error(state[size_t(i)].second, golden.get(pre + std::to_string(i) + ".buffer")), 1e-6)
          << "config " << c << " momentum of shape " << i;
  }
}

// Stacked experts [E, rows, cols] step as E separate matrices.
TEST(Muon, ExpertsAreMatricesEach) {
  Generator g(5, "muon experts");
  Tensor w = Tensor::empty({3, 6, 4}, DType::f32), grad = Tensor::empty({3, 6, 4}, DType::f32);
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = float(g.next_uniform()), grad.data<float>()[i] = float(g.next_uniform() - 0.5);
  autograd::Variable stacked(w.clone(), true, "experts");
  stacked.ensure_grad().copy_(grad.clone());
  nn::TrainableParam p;
  p.name = "experts", p.var = stacked;
  optim::Muon opt({p}, optim::MuonConfig{});
  opt.step(0.02f);
  for (int64_t e = 0; e < 3; ++e) {
    autograd::Variable one(w.select(0, e).contiguous(), true, "one");
    one.ensure_grad().copy_(grad.select(0, e).contiguous());
    nn::TrainableParam q;
    q.name = "one", q.var = one;
    optim::Muon single({q}, optim::MuonConfig{});
    single.step(0.02f);
    EXPECT_EQ(rel_error(stacked.value().select(0, e).contiguous(), one.value()), 0) << "expert " << e;
  }
}

// Newton-Schulz's purpose: the output's singular values sit in about (0.5, 1.5) whatever the
// input's scale. Checked through X X^T of a wide matrix: its eigenvalues (the squared singular
// values) within (0.25, 2.25), i.e. the Gram matrix's diagonal and Frobenius norm bounded so.
TEST(Muon, NewtonSchulzPullsSingularValuesTowardOne) {
  Generator g(9, "muon ns");
  Tensor x = Tensor::empty({8, 32}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1000.0f * float(g.next_uniform() - 0.5);
  optim::newton_schulz(x, optim::MuonConfig{});
  Tensor gram = Tensor::empty({8, 8}, DType::f32);
  kernels::matmul(gram, x, x, false, true);
  double frob = 0;
  for (int64_t i = 0; i < 64; ++i) frob += double(gram.data<float>()[i]) * gram.data<float>()[i];
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_GT(gram.data<float>()[r * 8 + r], 0.25) << r;
    EXPECT_LT(gram.data<float>()[r * 8 + r], 2.25) << r;
  }
  EXPECT_LT(std::sqrt(frob), 2.25 * std::sqrt(8.0));
}

TEST(Muon, RefusesNonMatrices) {
  autograd::Variable bias(Tensor::zeros({5}, DType::f32), true, "bias");
  nn::TrainableParam p;
  p.name = "norm.weight", p.var = bias;
  try {
    optim::Muon opt({p}, optim::MuonConfig{});
    FAIL() << "a vector was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("norm.weight"), std::string::npos) << e.message();
    EXPECT_NE(e.hint().find("AdamW"), std::string::npos) << e.hint();
  }
}

// ns_dtype bf16 rounds the iteration's GEMM inputs: the result stays within bf16's rounding of
// the f32 one (measured ~1e-2 relative) and keeps Newton-Schulz's purpose, singular values near 1.
TEST(Muon, NewtonSchulzInBf16StaysCloseToF32) {
  Generator g(21, "muon bf16");
  Tensor x = Tensor::empty({48, 96}, DType::f32);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(g.next_uniform() - 0.5);
  Tensor f32 = x.clone(), half = x.clone();
  optim::newton_schulz(f32, optim::MuonConfig{});
  optim::MuonConfig c;
  c.ns_dtype = DType::bf16;
  optim::newton_schulz(half, c);
  const double err = rel_error(half, f32);
  std::printf("newton_schulz bf16 against f32: relative error %.2e\n", err);
  EXPECT_GT(err, 0) << "bf16 GEMM inputs round: the results differ";
  EXPECT_LT(err, 5e-2);
  Tensor gram = Tensor::empty({48, 48}, DType::f32);
  kernels::matmul(gram, half, half, false, true);
  for (int64_t r = 0; r < 48; ++r) {
    EXPECT_GT(gram.data<float>()[r * 48 + r], 0.25) << r;
    EXPECT_LT(gram.data<float>()[r * 48 + r], 2.25) << r;
  }
}
