#include "titan/autograd/quantized_linear.h"

#include <string>

#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/quantize.h"

namespace titan::autograd {

namespace {

constexpr int64_t kTile = 128;  // DeepSeek-V3's tile and block edge

Tensor f32_matrix(const Shape& shape) { return Tensor::empty(shape, DType::f32, MemCategory::activations); }

// One operand quantized: codes and scales, with how to read them back.
struct Quantized {
  Tensor codes, scales;
  LowPrecision recipe;
  int64_t tile_rows = 0, tile_cols = 0;  // FP8 blockwise
  Tensor dequantize() const {
    Tensor out = f32_matrix(codes.shape());
    if (recipe == LowPrecision::fp8_blockwise)
      kernels::fp8_block_dequantize(out, codes, scales, tile_rows, tile_cols);
    else
      kernels::mx_dequantize(out, codes, scales);
    return out;
  }
};

// t [R, C] quantized along its rows (blocks within a row: the reduction runs along C).
Quantized quantize_rows(const Tensor& t, LowPrecision recipe, QuantRole role) {
  Quantized q;
  q.recipe = recipe;
  const int64_t rows = t.size(0), cols = t.size(1);
  if (recipe == LowPrecision::fp8_blockwise) {
    q.tile_rows = role == QuantRole::weight ? kTile : 1, q.tile_cols = kTile;
    q.codes = Tensor::empty({rows, cols}, DType::f8e4m3, MemCategory::activations);
    q.scales = f32_matrix({(rows + q.tile_rows - 1) / q.tile_rows, (cols + kTile - 1) / kTile});
    kernels::fp8_block_quantize(q.codes, q.scales, t, q.tile_rows, q.tile_cols);
    return q;
  }
  const bool fp4 = recipe == LowPrecision::mxfp4 && role == QuantRole::weight;
  q.codes = Tensor::empty({rows, cols}, fp4 ? DType::f4e2m1 : DType::f8e4m3, MemCategory::activations);
  q.scales = Tensor::empty({rows, (cols + 31) / 32}, DType::e8m0, MemCategory::activations);
  kernels::mx_quantize(q.codes, q.scales, t);
  return q;
}

}  // namespace

Tensor fake_quantize(const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows) {
  TITAN_CHECK(t.dim() == 2 && t.dtype() == DType::f32, "fake_quantize: needs an f32 matrix, got " + t.str());
  const Tensor m = t.contiguous();
  if (along_rows) return quantize_rows(m, recipe, role).dequantize();
  // Along the columns: FP8 tiles are 128 x 1 (a weight's blocks are square, the same either way);
  // MX blocks run along rows only, so the transpose is quantized and turned back.
  if (recipe == LowPrecision::fp8_blockwise) {
    Quantized q;
    q.recipe = recipe;
    q.tile_rows = kTile, q.tile_cols = role == QuantRole::weight ? kTile : 1;
    q.codes = Tensor::empty(m.shape(), DType::f8e4m3, MemCategory::activations);
    q.scales = f32_matrix({(m.size(0) + kTile - 1) / kTile, (m.size(1) + q.tile_cols - 1) / q.tile_cols});
    kernels::fp8_block_quantize(q.codes, q.scales, m, q.tile_rows, q.tile_cols);
    return q.dequantize();
  }
  return quantize_rows(m.transpose(0, 1).contiguous(), recipe, role).dequantize().transpose(0, 1).contiguous();
}

Variable quantized_linear(const Variable& x, const Variable& w, LowPrecision recipe) {
  ProfileScope prof("quantized_linear.fwd");
  const Tensor& wv = w.value();
  TITAN_CHECK(x.dtype() == DType::f32 && wv.dtype() == DType::f32 && wv.dim() == 2 && x.value().size(-1) == wv.size(1),
              "quantized_linear: x " + x.value().str() + " and w " + wv.str() + " must be f32 [..., K] and [M, K]",
              "low-precision recipes take the f32 activations and master weights");
  const int64_t k = wv.size(1), m = wv.size(0), n = x.value().numel() / k;
  const Tensor x2 = x.value().contiguous().view({n, k});
  // Forward: x along K, kept quantized for backward; w along K.
  const Quantized xq = quantize_rows(x2, recipe, QuantRole::activation);
  Shape ys = x.shape();
  ys[ys.size() - 1] = m;
  Tensor y = f32_matrix({n, m});
  kernels::linear_forward(y, xq.dequantize(), fake_quantize(wv, recipe, QuantRole::weight, true));
  return record("quantized_linear", {x, w}, y.view(ys), [xq, wv, recipe, n, m, k](const Tensor& dy_in, GradSink& g) {
    ProfileScope prof_bwd("quantized_linear.bwd");
    const Tensor dy = dy_in.contiguous().view({n, m}), none;
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), nothing;
    if (dx.defined()) {  // dx = Q(dy along M) Q(w along M)
      Tensor dx2 = dx.view({n, k});
      kernels::linear_backward(dx2, nothing, nothing, fake_quantize(dy, recipe, QuantRole::activation, true), none,
                               fake_quantize(wv, recipe, QuantRole::weight, false), accumulate_dx, true);
    }
    if (dw.defined()) {  // dw = Q(dy along N)^T Q(x along N)
      const Tensor xs = fake_quantize(xq.dequantize(), recipe, QuantRole::activation, false);
      kernels::linear_backward(nothing, dw, nothing, fake_quantize(dy, recipe, QuantRole::activation, false), xs, none,
                               true, accumulate_dw);
    }
  });
}

}  // namespace titan::autograd
