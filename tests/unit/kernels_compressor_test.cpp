// DeepSeek-V4's compressor pooling (kernels/compressor.h) against what each entry must be: with
// zero gates and biases every slot weighs the same, so an HCA entry is its window's mean, a CSA
// entry w >= 1 the mean of the previous window's first halves and its own second halves, and
// CSA's entry 0 its own window's second halves alone (the missing slots weigh 0); the tail past
// the last complete window feeds nothing.
#include <gtest/gtest.h>

#include "titan/autograd/ops.h"
#include "titan/core/rng.h"
#include "titan/kernels/compressor.h"

using namespace titan;

namespace {

Tensor iota(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(i % 97) * 0.25f - 5;
  return t;
}

}  // namespace

TEST(Compressor, EqualWeightsGiveWindowMeans) {
  const int64_t S = 11, D = 3, m = 4;  // 2 entries, 3 tail tokens
  for (const auto kind : {kernels::CompressorKind::hca, kernels::CompressorKind::csa}) {
    const int64_t C = kind == kernels::CompressorKind::hca ? D : 2 * D;
    const Tensor kv = iota({1, S, C});
    const Tensor gate = Tensor::zeros({1, S, C}, DType::f32), bias = Tensor::zeros({m, C}, DType::f32);
    Tensor out = Tensor::empty({1, S / m, D}, DType::f32);
    kernels::compressor_forward(out, kv, gate, bias, m, kind);
    const float* v = kv.data<float>();
    for (int64_t w = 0; w < S / m; ++w)
      for (int64_t c = 0; c < D; ++c) {
        double sum = 0;
        int count = 0;
        for (int64_t r = 0; r < m; ++r) {
          if (kind == kernels::CompressorKind::hca) {
            sum += v[(w * m + r) * C + c], ++count;
            continue;
          }
          sum += v[(w * m + r) * C + D + c], ++count;                              // own second halves
          if (w > 0) sum += v[((w - 1) * m + r) * C + c], ++count;                 // previous first halves
        }
        EXPECT_NEAR(out.data<float>()[w * D + c], sum / count, 1e-5) << int(kind) << " entry " << w << " channel " << c;
      }
    // The tail (tokens 8..10) feeds no entry: no gradient reaches it.
    Tensor dkv = Tensor::zeros(kv.shape(), DType::f32), dgate = Tensor::zeros(kv.shape(), DType::f32);
    Tensor dbias = Tensor::zeros(bias.shape(), DType::f32), dout = Tensor::full(out.shape(), 1.0, DType::f32);
    kernels::compressor_backward(dkv, dgate, dbias, dout, kv, gate, bias, m, kind);
    for (int64_t i = 2 * m * C; i < S * C; ++i) EXPECT_EQ(dkv.data<float>()[i], 0) << i;
  }
}

// The autograd op (autograd::compressor) gives each input the kernel's gradient.
TEST(Compressor, AutogradOpGradientsAreTheKernels) {
  const int64_t B = 2, S = 10, D = 5, m = 3, C = 2 * D;
  Generator g(11, "compressor autograd");
  auto random = [&](const Shape& s) {
    Tensor t = Tensor::empty(s, DType::f32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(2 * g.next_uniform() - 1);
    return t;
  };
  const Tensor kv = random({B, S, C}), gate = random({B, S, C}), bias = random({m, C}), dout = random({B, S / m, D});
  autograd::Variable vk(kv.clone(), true), vg(gate.clone(), true), vb(bias.clone(), true);
  autograd::Variable loss = autograd::sum(autograd::mul(autograd::compressor(vk, vg, vb, m, kernels::CompressorKind::csa),
                                                        autograd::Variable(dout)));
  autograd::backward(loss);
  Tensor dkv = Tensor::zeros(kv.shape(), DType::f32), dgate = Tensor::zeros(kv.shape(), DType::f32);
  Tensor dbias = Tensor::zeros(bias.shape(), DType::f32);
  kernels::compressor_backward(dkv, dgate, dbias, dout, kv, gate, bias, m, kernels::CompressorKind::csa);
  for (const auto& [got, want] : {std::pair{vk.grad(), dkv}, std::pair{vg.grad(), dgate}, std::pair{vb.grad(), dbias}})
    for (int64_t i = 0; i < want.numel(); ++i) EXPECT_FLOAT_EQ(got.data<float>()[i], want.data<float>()[i]) << i;
}
