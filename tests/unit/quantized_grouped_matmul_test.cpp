// autograd/quantized_grouped_matmul.h (quantize.grouped_mm.*): per expert, the quantized grouped
// GEMMs give quantized_linear's forward, dx and dw on that expert's rows, on awkward shapes (an
// empty expert, uneven segments, K and N not multiples of 32 or 128), for each recipe; wgrad's
// token tiles restart at the given starts (dw is then the sum of quantized_linear's dw over the
// pieces); the weights' forms are cached per parameters epoch in kept buffers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/random_tensor.h"
#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/quantized_grouped_matmul.h"
#include "titan/core/rng.h"

using namespace titan;
using titan::test::relative_error;
using autograd::LowPrecision;
using autograd::Variable;

namespace {

Tensor normal(const Shape& shape, uint64_t seed, double std = 1) { return test::normal(shape, seed, "quantized_grouped_matmul", std); }

const char* name(LowPrecision r) {
  return r == LowPrecision::fp8_blockwise ? "fp8_blockwise" : r == LowPrecision::mxfp8 ? "mxfp8" : "mxfp4";
}

}  // namespace

TEST(QuantizedGroupedMatmul, EachExpertGetsQuantizedLinearsForwardAndGradients) {
  // 4 experts with 5, 0, 95 and 72 rows; K = 70, N = 46: no multiple of 32 or 128 anywhere (N
  // even for FP4's dgrad weight along N). Expert 2's rows are two sequences (a tile start at row
  // 60 inside it), so its dw sums two pieces' products.
  const int64_t k = 70, n = 46, rows = 172;
  const std::vector<int64_t> offsets = {0, 5, 5, 100, 172};
  std::vector<int64_t> group(size_t(rows), 0);
  for (int64_t r = 60; r < rows; ++r) group[size_t(r)] = 1;
  const std::vector<int64_t> starts = autograd::token_tile_starts(offsets, group);
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 5, 60, 100}));
  const Tensor x = normal({rows, k}, 1), w = normal({4, n, k}, 2, 0.05), dc = normal({rows, n}, 3);
  for (LowPrecision r : {LowPrecision::fp8_blockwise, LowPrecision::mxfp8, LowPrecision::mxfp4}) {
    autograd::QuantizedExperts qw;
    qw.refresh(w, r);
    const autograd::QuantizedRows xq = autograd::quantize_activation_rows(x, r);
    Tensor c = Tensor::empty({rows, n}, DType::f32), da = Tensor::empty({rows, k}, DType::f32),
           dw = Tensor::full({4, n, k}, 7.0, DType::f32);  // written, not added to
    autograd::quantized_grouped_forward(c, xq, qw, offsets);
    autograd::quantized_grouped_backward(da, dw, dc, xq, qw, offsets, starts, false, false);
    // The reference: quantized_linear on each piece (a piece: rows between two tile starts).
    std::vector<Tensor> dw_ref;
    for (int64_t e = 0; e < 4; ++e) dw_ref.push_back(Tensor::zeros({n, k}, DType::f32));
    const std::vector<int64_t> bounds = {0, 5, 60, 100, 172};
    const std::vector<int64_t> expert_of = {0, 2, 2, 3};
    for (size_t p = 0; p + 1 < bounds.size(); ++p) {
      const int64_t b0 = bounds[p], b1 = bounds[p + 1], e = expert_of[p];
      Variable xv(x.slice(0, b0, b1).contiguous(), true), wv(w.select(0, e).contiguous(), true);
      Variable y = autograd::quantized_linear(xv, wv, r);
      autograd::backward(y, dc.slice(0, b0, b1).contiguous());
      // Forward and dx are row-wise: the same values whatever the grouping (GEMM sums within 1e-6).
      EXPECT_LT(relative_error(c.slice(0, b0, b1), y.value()), 1e-6) << name(r) << " rows " << b0;
      EXPECT_LT(relative_error(da.slice(0, b0, b1), xv.grad()), 1e-6) << name(r) << " rows " << b0;
      float* acc = dw_ref[size_t(e)].data<float>();
      const Tensor g = wv.grad().contiguous();
      for (int64_t i = 0; i < n * k; ++i) acc[i] += g.data<float>()[i];
    }
    for (int64_t e = 0; e < 4; ++e)
      EXPECT_LT(relative_error(dw.select(0, e), dw_ref[size_t(e)]), 1e-6) << name(r) << " expert " << e;
    // The empty expert's dw is written as zeros.
    EXPECT_EQ(relative_error(dw.select(0, 1), Tensor::zeros({n, k}, DType::f32)), 0.0);
    // The tiles matter: without the start at row 60, expert 2's dw takes other scales.
    Tensor dw_one = Tensor::empty({4, n, k}, DType::f32);
    autograd::quantized_grouped_backward(Tensor(), dw_one, dc, xq, qw, offsets, std::vector<int64_t>{0, 5, 100}, false,
                                         false);
    EXPECT_GT(relative_error(dw_one.select(0, 2), dw_ref[2]), 1e-6) << name(r);
    // bf16 operands (the MoE's mixed-precision path): computed on their f32 values, the result cast.
    const Tensor x16 = x.to(DType::bf16);
    Tensor c16 = Tensor::empty({rows, n}, DType::bf16), c32 = Tensor::empty({rows, n}, DType::f32);
    autograd::quantized_grouped_forward(c16, autograd::quantize_activation_rows(x16, r), qw, offsets);
    autograd::quantized_grouped_forward(c32, autograd::quantize_activation_rows(x16.to(DType::f32), r), qw, offsets);
    EXPECT_EQ(relative_error(c16.to(DType::f32), c32.to(DType::bf16).to(DType::f32)), 0.0) << name(r);
  }
}

TEST(QuantizedGroupedMatmul, WeightFormsAreCachedPerParametersEpoch) {
  Tensor w = normal({3, 64, 96}, 4, 0.05);
  autograd::QuantizedExperts qw;
  qw.refresh(w, LowPrecision::mxfp4);
  const void* buffer = qw.along_k.data_ptr();
  const float first = qw.along_k.data<float>()[0];
  w.data<float>()[0] += 1.0f;
  qw.refresh(w, LowPrecision::mxfp4);  // the epoch did not move: the forms stay
  EXPECT_EQ(qw.along_k.data<float>()[0], first);
  autograd::note_parameters_changed();
  qw.refresh(w, LowPrecision::mxfp4);
  EXPECT_NE(qw.along_k.data<float>()[0], first);
  EXPECT_EQ(qw.along_k.data_ptr(), buffer);  // recomputed in place
  // MXFP4: 64 x 96 FP4 codes (half a byte each) and e8m0 scales along K, per expert (the forms
  // along N are only the f32 values the emulated dgrad reads: no codes are kept for them).
  EXPECT_EQ(qw.stored_bytes(), 3 * (64 * 96 / 2 + 64 * 3));
}
