#include "titan/autograd/quantized_linear.h"

#include <atomic>
#include <string>

#include "titan/autograd/ops.h"
#include "titan/autograd/scratch_buffer.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/quantize.h"

namespace titan::autograd {

namespace {

constexpr int64_t kTile = 128;  // DeepSeek-V3's tile and block edge

Tensor f32_matrix(const Shape& shape) { return Tensor::empty(shape, DType::f32, MemCategory::activations); }

DType mx_element(LowPrecision recipe, QuantRole role) {
  return recipe == LowPrecision::mxfp4 && role == QuantRole::weight ? DType::f4e2m1 : DType::f8e4m3;
}

// QuantizedRows with its storage for [rows, cols] quantized as `role`, and a one-pass fill.
struct Quantized : QuantizedRows {
  Quantized(int64_t rows, int64_t cols, LowPrecision r, QuantRole role, MemCategory category) {
    recipe = r;
    if (recipe == LowPrecision::fp8_blockwise) {
      tile_rows = role == QuantRole::weight ? kTile : 1, tile_cols = kTile;
      codes = Tensor::empty({rows, cols}, DType::f8e4m3, category);
      scales = Tensor::empty({(rows + tile_rows - 1) / tile_rows, (cols + kTile - 1) / kTile}, DType::f32, category);
    } else {
      codes = Tensor::empty({rows, cols}, mx_element(recipe, role), category);
      scales = Tensor::empty({rows, (cols + 31) / 32}, DType::e8m0, category);
    }
  }
  // t into codes and scales, and its dequantized values into values, in one pass.
  void quantize(Tensor& values, const Tensor& t) {
    ProfileScope prof("fake_quantize");
    if (recipe == LowPrecision::fp8_blockwise)
      kernels::fp8_block_fake_quantize(values, codes, scales, t, tile_rows, tile_cols);
    else
      kernels::mx_fake_quantize(values, codes, scales, t);
  }
};

// out = t [R, C] quantized as `recipe` quantizes `role` along its rows or columns, dequantized;
// out may be t. FP8 tiles along the columns are 128 x 1 (a weight's blocks are square, the same
// either way); MX blocks of 32 run down the columns.
void fake_quantize_into(Tensor& out, const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows) {
  ProfileScope prof("fake_quantize");
  if (recipe == LowPrecision::fp8_blockwise) {
    const int64_t across = role == QuantRole::weight ? kTile : 1;
    kernels::fp8_block_fake_quantize(out, t, along_rows ? across : kTile, along_rows ? kTile : across);
  } else {
    kernels::mx_fake_quantize(out, t, mx_element(recipe, role), along_rows);
  }
}

// Buffers for the GEMMs' dequantized operands, kept per thread from call to call (the forward's
// x, the backward's dy and x): what quantized_linear allocates in a steady state is only its
// output and what backward keeps.
ScratchBuffer& operand_scratch(int i) {
  thread_local ScratchBuffer buffers[2];
  return buffers[i];
}

}  // namespace

void QuantizedRows::dequantize(Tensor& out) const {
  ProfileScope prof("dequantize");
  if (recipe == LowPrecision::fp8_blockwise)
    kernels::fp8_block_dequantize(out, codes, scales, tile_rows, tile_cols);
  else
    kernels::mx_dequantize(out, codes, scales);
}

Tensor QuantizedRows::dequantize() const {
  Tensor out = f32_matrix(codes.shape());
  dequantize(out);
  return out;
}

QuantizedRows quantize_rows(const Tensor& t, LowPrecision recipe, QuantRole role) {
  Quantized q(t.size(0), t.size(1), recipe, role, MemCategory::activations);
  if (recipe == LowPrecision::fp8_blockwise)
    kernels::fp8_block_quantize(q.codes, q.scales, t, q.tile_rows, q.tile_cols);
  else
    kernels::mx_quantize(q.codes, q.scales, t);
  return q;
}

Tensor fake_quantize(const Tensor& t, LowPrecision recipe, QuantRole role, bool along_rows) {
  TITAN_CHECK(t.dim() == 2 && t.dtype() == DType::f32, "fake_quantize: needs an f32 matrix, got " + t.str());
  const Tensor m = t.contiguous();
  Tensor out = f32_matrix(m.shape());
  fake_quantize_into(out, m, recipe, role, along_rows);
  return out;
}

namespace {
std::atomic<uint64_t> g_parameters_epoch{0};

// dst (kept across calls; (re)allocated only when its shape or dtype differs).
Tensor& kept(Tensor& dst, const Shape& shape, DType dtype) {
  if (!dst.defined() || dst.shape() != shape || dst.dtype() != dtype)
    dst = Tensor::empty(shape, dtype, MemCategory::parameters);
  return dst;
}
}  // namespace

uint64_t parameters_epoch() { return g_parameters_epoch.load(); }
void note_parameters_changed() { ++g_parameters_epoch; }

void QuantizedWeight::refresh(const Tensor& w, LowPrecision recipe) {
  if (epoch_ == parameters_epoch() && along_k.defined() && along_k.shape() == w.shape()) return;
  TITAN_CHECK(!adopted_, "quantized weight " + w.shape().str() + ": its FP8 all-gather forms are from before the "
                         "parameters last changed, and no new ones were gathered",
              "FSDP gathers a unit's weights before its forward; report this as a bug (a forward outside the unit's hooks?)");
  ProfileScope prof("quantized_weight.refresh");
  TITAN_CHECK(w.dim() == 2, "quantized weight: needs a matrix, got " + w.str());
  Tensor m = w.contiguous();
  if (w.dtype() != DType::f32) {  // a bf16 compute copy (mixed precision): its f32 values
    kept(widened_, w.shape(), DType::f32).copy_(w);
    m = widened_;
  }
  const int64_t rows = m.size(0), cols = m.size(1);
  kept(along_k, m.shape(), DType::f32);
  if (recipe == LowPrecision::fp8_blockwise) {
    kept(codes, {rows, cols}, DType::f8e4m3);
    kept(scales, {(rows + kTile - 1) / kTile, (cols + kTile - 1) / kTile}, DType::f32);
    kernels::fp8_block_fake_quantize(along_k, codes, scales, m, kTile, kTile);
    along_m = along_k;  // 128 x 128 blocks: the same values along either dimension
  } else {
    kept(codes, {rows, cols}, mx_element(recipe, QuantRole::weight));
    kept(scales, {rows, (cols + 31) / 32}, DType::e8m0);
    kernels::mx_fake_quantize(along_k, codes, scales, m);
    // Along M: blocks of 32 down w's columns (w^T's rows), with no transpose made.
    kernels::mx_fake_quantize(kept(along_m, m.shape(), DType::f32), m, mx_element(recipe, QuantRole::weight), false);
  }
  epoch_ = parameters_epoch();
}

void QuantizedWeight::adopt_fp8_blockwise(const Tensor& gathered_codes, const Tensor& block_scales) {
  adopted_ = true;
  if (epoch_ == parameters_epoch() && along_k.defined() && along_k.shape() == gathered_codes.shape())
    return;  // gathered again (for backward) from the same parameters: the same forms
  ProfileScope prof("quantized_weight.adopt");
  codes = gathered_codes;
  scales = block_scales;
  kernels::fp8_block_dequantize(kept(along_k, codes.shape(), DType::f32), codes, scales, kTile, kTile);
  along_m = along_k;
  epoch_ = parameters_epoch();
}

int64_t QuantizedWeight::stored_bytes() const {
  int64_t total = 0;
  for (const Tensor* t : {&codes, &scales})
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
  Quantized xq(n, k, recipe, QuantRole::activation, MemCategory::activations);
  Tensor xv = operand_scratch(0).get({n, k}, DType::f32);
  xq.quantize(xv, x2);
  Shape ys = xf.shape();
  ys[ys.size() - 1] = m;
  Tensor y = f32_matrix({n, m});
  kernels::linear_forward(y, xv, cache.along_k);
  const Variable out = record("quantized_linear", {xf, w}, y.view(ys),
                              [xq, w_m = cache.along_m, recipe, n, m, k](const Tensor& dy_in, GradSink& g) {
    ProfileScope prof_bwd("quantized_linear.bwd");
    const Tensor dy = dy_in.contiguous().view({n, m}), none;
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), nothing;
    Tensor dyq = operand_scratch(0).get({n, m}, DType::f32);
    if (dx.defined()) {  // dx = Q(dy along M) Q(w along M)
      Tensor dx2 = dx.view({n, k});
      fake_quantize_into(dyq, dy, recipe, QuantRole::activation, true);
      kernels::linear_backward(dx2, nothing, nothing, dyq, none, w_m, accumulate_dx, true);
    }
    if (dw.defined()) {  // dw = Q(dy along N)^T Q(x along N): x's forward values re-quantized across tokens
      fake_quantize_into(dyq, dy, recipe, QuantRole::activation, false);
      Tensor xs = operand_scratch(1).get({n, k}, DType::f32);
      xq.dequantize(xs);
      fake_quantize_into(xs, xs, recipe, QuantRole::activation, false);
      kernels::linear_backward(nothing, dw, nothing, dyq, xs, none, true, accumulate_dw);
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
