// autograd::quantized_linear (FP8 blockwise, MXFP8, MXFP4 weights): each GEMM sees exactly the
// operands the recipe quantizes (checked against plain f32 GEMMs of fake_quantize's values), the
// gradients pass straight through the quantizers, and at K = 4096 the error against f32 stays
// within what the formats' rounding explains (printed: the bound and the measured error).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/random_tensor.h"
#include "common/kernel_check.h"
#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/quantized_linear.h"
#include "titan/core/rng.h"
#include "titan/kernels/matmul.h"

using namespace titan;
using titan::test::relative_error;
using autograd::LowPrecision;
using autograd::QuantRole;
using autograd::Variable;

namespace {

Tensor normal(const Shape& shape, uint64_t seed, double std = 1) { return test::normal(shape, seed, "quantized_linear", std); }

Tensor gemm_nt(const Tensor& a, const Tensor& b) {  // a [N, K] b [M, K]^T
  Tensor c = Tensor::empty({a.size(0), b.size(0)}, DType::f32);
  kernels::matmul(c, a, b, false, true);
  return c;
}

const char* name(LowPrecision r) {
  return r == LowPrecision::fp8_blockwise ? "fp8_blockwise" : r == LowPrecision::mxfp8 ? "mxfp8" : "mxfp4";
}

struct Grads {
  Tensor y, dx, dw;
};

Grads run(const Tensor& x, const Tensor& w, const Tensor& dy, LowPrecision r) {
  Variable xv(x.clone(), true), wv(w.clone(), true);
  Variable y = autograd::quantized_linear(xv, wv, r);
  autograd::backward(y, dy);
  return {y.value(), xv.grad(), wv.grad()};
}

}  // namespace

TEST(QuantizedLinear, EachGemmTakesTheRecipesOperandsAndGradientsPassStraightThrough) {
  // Awkward sizes: tokens and widths that are not multiples of 32 or 128 (ragged blocks and tiles).
  const int64_t n = 70, k = 200, m = 130;
  const Tensor x = normal({n, k}, 1), w = normal({m, k}, 2, 0.05), dy = normal({n, m}, 3);
  for (LowPrecision r : {LowPrecision::fp8_blockwise, LowPrecision::mxfp8, LowPrecision::mxfp4}) {
    const Grads got = run(x, w, dy, r);
    const auto fq = [&](const Tensor& t, QuantRole role, bool rows) { return autograd::fake_quantize(t, r, role, rows); };
    const Tensor xq = fq(x, QuantRole::activation, true);
    const Tensor y = gemm_nt(xq, fq(w, QuantRole::weight, true));
    const Tensor dx = gemm_nt(fq(dy, QuantRole::activation, true), fq(w, QuantRole::weight, false).transpose(0, 1).contiguous());
    const Tensor dw = gemm_nt(fq(dy, QuantRole::activation, false).transpose(0, 1).contiguous(),
                              fq(xq, QuantRole::activation, false).transpose(0, 1).contiguous());
    EXPECT_EQ(test::to_doubles(got.y), test::to_doubles(y)) << name(r);
    EXPECT_LT(relative_error(got.dx, dx), 1e-6) << name(r);
    EXPECT_LT(relative_error(got.dw, dw), 1e-6) << name(r);
    // Quantization happened: the result is not the f32 one.
    EXPECT_GT(relative_error(got.y, gemm_nt(x, w)), 1e-4) << name(r);
  }
}

TEST(QuantizedLinear, ErrorAtK4096IsWhatTheFormatsRoundingExplains) {
  // y = x w^T with Gaussian x and w: independent rounding errors of relative size e_x and e_w in
  // the operands give the product a relative error of about sqrt(e_x^2 + e_w^2); the test allows
  // 1.5x that (from the operands' measured quantization errors) and requires each operand's
  // error below its format's rounding bound (E4M3: 2^-4; E2M1: 2^-2; MX adds up to 1/8 and 1/4
  // saturation of a block's largest value, which the rms stays well under).
  const int64_t n = 64, k = 4096, m = 64;
  const Tensor x = normal({n, k}, 4), w = normal({m, k}, 5, 0.02), dy = normal({n, m}, 6);
  const Tensor y32 = gemm_nt(x, w);
  for (LowPrecision r : {LowPrecision::fp8_blockwise, LowPrecision::mxfp8, LowPrecision::mxfp4}) {
    const Tensor xq = autograd::fake_quantize(x, r, QuantRole::activation, true);
    const Tensor wq = autograd::fake_quantize(w, r, QuantRole::weight, true);
    const double ex = relative_error(xq, x), ew = relative_error(wq, w);
    const double bound_w = r == LowPrecision::mxfp4 ? 0.25 : 0.0625;
    EXPECT_LT(ex, 0.0625) << name(r);
    EXPECT_LT(ew, bound_w) << name(r);
    const double err = relative_error(run(x, w, dy, r).y, y32), bound = 1.5 * std::sqrt(ex * ex + ew * ew);
    std::printf("%-14s K = %lld: ||y - y32|| / ||y32|| = %.4f (bound %.4f; operand errors x %.4f, w %.4f)\n", name(r),
                static_cast<long long>(k), err, bound, ex, ew);
    EXPECT_LT(err, bound) << name(r);
    EXPECT_GT(err, 0.2 * bound) << name(r);  // the operands' errors do reach the product
  }
}
