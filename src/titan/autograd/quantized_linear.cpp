#include "titan/autograd/quantized_linear.h"

#include <atomic>
#include <string>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/quantize.h"

namespace titan::autograd {

namespace {

constexpr int64_t kTile = 128;  // DeepSeek-V3's tile and block edge

Tensor f32_matrix(const Shape& shape) { return Tensor::empty(shape, DType::f32, MemCategory::activations); }

}  // namespace

Tensor QuantizedRows::dequantize() const {
  Tensor out = f32_matrix(codes.shape());
  if (recipe == LowPrecision::fp8_blockwise)
    kernels::fp8_block_dequantize(out, codes, scales, tile_rows, tile_cols);
  else
    kernels::mx_dequantize(out, codes, scales);
  return out;
}

QuantizedRows quantize_rows(const Tensor& t, LowPrecision recipe, QuantRole role) {
  QuantizedRows q;
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

Tensor fake_quantize(const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows) {
  TITAN_CHECK(t.dim() == 2 && t.dtype() == DType::f32, "fake_quantize: needs an f32 matrix, got " + t.str());
  const Tensor m = t.contiguous();
  if (along_rows) return quantize_rows(m, recipe, role).dequantize();
  // Along the columns: FP8 tiles are 128 x 1 (a weight's blocks are square, the same either way);
  // MX blocks run along rows only, so the transpose is quantized and turned back.
  if (recipe == LowPrecision::fp8_blockwise) {
    QuantizedRows q;
    q.recipe = recipe;
    q.tile_rows = kTile, q.tile_cols = role == QuantRole::weight ? kTile : 1;
    q.codes = Tensor::empty(m.shape(), DType::f8e4m3, MemCategory::activations);
    q.scales = f32_matrix({(m.size(0) + kTile - 1) / kTile, (m.size(1) + q.tile_cols - 1) / q.tile_cols});
    kernels::fp8_block_quantize(q.codes, q.scales, m, q.tile_rows, q.tile_cols);
    return q.dequantize();
  }
  return quantize_rows(m.transpose(0, 1).contiguous(), recipe, role).dequantize().transpose(0, 1).contiguous();
}

namespace {
std::atomic<uint64_t> g_parameters_epoch{0};

// dst (kept across calls; (re)allocated only when its shape or dtype differs).
Tensor& kept(Tensor& dst, const Shape& shape, DType dtype) {
  if (!dst.defined() || dst.shape() != shape || dst.dtype() != dtype)
    dst = Tensor::empty(shape, dtype, MemCategory::parameters);
  return dst;
}

// t [R, C] quantized along its rows as a weight into codes / scales, then read back into values.
void weight_rows(Tensor& codes, Tensor& scales, Tensor& values, const Tensor& t, LowPrecision recipe) {
  const int64_t rows = t.size(0), cols = t.size(1);
  if (recipe == LowPrecision::fp8_blockwise) {
    kept(codes, {rows, cols}, DType::f8e4m3);
    kept(scales, {(rows + kTile - 1) / kTile, (cols + kTile - 1) / kTile}, DType::f32);
    kernels::fp8_block_quantize(codes, scales, t, kTile, kTile);
    kernels::fp8_block_dequantize(kept(values, {rows, cols}, DType::f32), codes, scales, kTile, kTile);
    return;
  }
  kept(codes, {rows, cols}, recipe == LowPrecision::mxfp4 ? DType::f4e2m1 : DType::f8e4m3);
  kept(scales, {rows, (cols + 31) / 32}, DType::e8m0);
  kernels::mx_quantize(codes, scales, t);
  kernels::mx_dequantize(kept(values, {rows, cols}, DType::f32), codes, scales);
}
}  // namespace

uint64_t parameters_epoch() { return g_parameters_epoch.load(); }
void note_parameters_changed() { ++g_parameters_epoch; }

void QuantizedWeight::refresh(const Tensor& w, LowPrecision recipe) {
  if (epoch_ == parameters_epoch() && along_k.defined() && along_k.shape() == w.shape()) return;
  ProfileScope prof("quantized_weight.refresh");
  TITAN_CHECK(w.dim() == 2, "quantized weight: needs a matrix, got " + w.str());
  Tensor m = w.contiguous();
  if (w.dtype() != DType::f32) {  // a bf16 compute copy (mixed precision): its f32 values
    kept(widened_, w.shape(), DType::f32).copy_(w);
    m = widened_;
  }
  weight_rows(codes, scales, along_k, m, recipe);
  if (recipe == LowPrecision::fp8_blockwise) {
    along_m = along_k;  // 128 x 128 blocks: the same values along either dimension
  } else {
    // MX blocks run along rows: quantize w^T [K, M] along its rows, keep the values as [M, K].
    Tensor& t = kept(transposed_, {m.size(1), m.size(0)}, DType::f32);
    t.copy_(m.transpose(0, 1));
    weight_rows(codes_m_, scales_m_, values_t_, t, recipe);
    kept(along_m, m.shape(), DType::f32).copy_(values_t_.transpose(0, 1));
  }
  epoch_ = parameters_epoch();
}

int64_t QuantizedWeight::stored_bytes() const {
  int64_t total = 0;
  for (const Tensor* t : {&codes, &scales, &codes_m_, &scales_m_})
    if (t->defined()) total += int64_t(t->nbytes());
  return total;
}

Variable quantized_linear(const Variable& x, const Variable& w, const Tensor& w_value, LowPrecision recipe,
                          QuantizedWeight& cache) {
  ProfileScope prof("quantized_linear.fwd");
  cache.refresh(w_value, recipe);
  const int64_t k = w_value.size(1), m = w_value.size(0);
  TITAN_CHECK(x.value().size(-1) == k, "quantized_linear: x " + x.value().str() + " for a weight " + w_value.str(),
              "the input's last dimension must be the weight's second");
  const DType out_dtype = x.dtype();
  const Variable xf = out_dtype == DType::f32 ? x : cast(x, DType::f32);
  const int64_t n = xf.value().numel() / k;
  const Tensor x2 = xf.value().contiguous().view({n, k});
  // Forward on Q(x along K), kept quantized (1 byte a value) for backward, and Q(w along K).
  const QuantizedRows xq = quantize_rows(x2, recipe, QuantRole::activation);
  Shape ys = xf.shape();
  ys[ys.size() - 1] = m;
  Tensor y = f32_matrix({n, m});
  kernels::linear_forward(y, xq.dequantize(), cache.along_k);
  const Variable out = record("quantized_linear", {xf, w}, y.view(ys),
                              [xq, w_m = cache.along_m, recipe, n, m, k](const Tensor& dy_in, GradSink& g) {
    ProfileScope prof_bwd("quantized_linear.bwd");
    const Tensor dy = dy_in.contiguous().view({n, m}), none;
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), nothing;
    if (dx.defined()) {  // dx = Q(dy along M) Q(w along M)
      Tensor dx2 = dx.view({n, k});
      kernels::linear_backward(dx2, nothing, nothing, fake_quantize(dy, recipe, QuantRole::activation, true), none, w_m,
                               accumulate_dx, true);
    }
    if (dw.defined()) {  // dw = Q(dy along N)^T Q(x along N)
      const Tensor xs = fake_quantize(xq.dequantize(), recipe, QuantRole::activation, false);
      kernels::linear_backward(nothing, dw, nothing, fake_quantize(dy, recipe, QuantRole::activation, false), xs, none,
                               true, accumulate_dw);
    }
  });
  return out_dtype == DType::f32 ? out : cast(out, out_dtype);
}

Variable quantized_linear(const Variable& x, const Variable& w, LowPrecision recipe) {
  TITAN_CHECK(x.dtype() == DType::f32 && w.dtype() == DType::f32 && w.value().dim() == 2,
              "quantized_linear: x " + x.value().str() + " and w " + w.value().str() + " must be f32 [..., K] and [M, K]",
              "low-precision recipes take the f32 activations and master weights");
  QuantizedWeight once;  // the backward holds the forms it needs
  return quantized_linear(x, w, w.value(), recipe, once);
}

}  // namespace titan::autograd
