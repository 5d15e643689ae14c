#include "titan/autograd/quantized_grouped_matmul.h"

#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/cast.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/grouped_matmul.h"

namespace titan::autograd {

namespace {

Tensor f32_matrix(const Shape& shape) { return Tensor::empty(shape, DType::f32, MemCategory::activations); }

// t's f32 values: t itself when already f32 and contiguous.
Tensor as_f32(const Tensor& t) {
  if (t.dtype() == DType::f32) return t.contiguous();
  Tensor out = f32_matrix(t.shape());
  kernels::cast(out, t.contiguous());
  return out;
}

// dst (any float dtype) = src, or += src, src f32.
void store(const Tensor& dst, const Tensor& src, bool accumulate) {
  Tensor d = dst;
  if (d.dtype() == DType::f32) {
    if (accumulate) kernels::axpby(d, src, 1.0, 1.0);
    else d.copy_(src);
    return;
  }
  if (!accumulate) {
    kernels::cast(d, src);
    return;
  }
  Tensor narrow = Tensor::empty(src.shape(), d.dtype(), MemCategory::temporaries);
  kernels::cast(narrow, src);
  kernels::axpby(d, narrow, 1.0, 1.0);
}

}  // namespace

void QuantizedExperts::refresh(const Tensor& w, LowPrecision recipe) {
  if (epoch_ == parameters_epoch() && recipe_ == recipe && along_k.defined() && along_k.shape() == w.shape()) return;
  ProfileScope prof("quantized_experts.refresh");
  TITAN_CHECK(w.dim() == 3, "quantized experts: need stacked weights [E, N, K], got " + w.str());
  const int64_t experts = w.size(0);
  if (!along_k.defined() || along_k.shape() != w.shape()) {
    along_k = Tensor::empty(w.shape(), DType::f32, MemCategory::parameters);
    along_m = Tensor::empty(w.shape(), DType::f32, MemCategory::parameters);
  }
  experts_.resize(size_t(experts));
  const Tensor whole = w.contiguous();
  for (int64_t e = 0; e < experts; ++e) {
    QuantizedWeight& q = experts_[size_t(e)];
    // Each expert alone: its blocks never reach into the next expert's rows. A step's first call
    // recomputes (the epoch moved): so does recipe_'s change, which the epoch alone would miss.
    if (recipe_ != recipe) q = QuantizedWeight();
    q.refresh(whole.select(0, e), recipe);
    along_k.select(0, e).copy_(q.along_k);
    along_m.select(0, e).copy_(q.along_m);
  }
  recipe_ = recipe;
  epoch_ = parameters_epoch();
}

int64_t QuantizedExperts::stored_bytes() const {
  int64_t total = 0;
  for (const QuantizedWeight& q : experts_) total += q.stored_bytes();
  return total;
}

QuantizedRows quantize_activation_rows(const Tensor& a, LowPrecision recipe) {
  TITAN_CHECK(a.dim() == 2, "quantized grouped GEMM: the rows must be a matrix [R, K], got " + a.str());
  return quantize_rows(as_f32(a), recipe, QuantRole::activation);
}

void quantized_grouped_forward(Tensor& c, const QuantizedRows& aq, const QuantizedExperts& w,
                               std::span<const int64_t> offsets) {
  ProfileScope prof("quantized_grouped_mm.fwd");
  const Tensor a = aq.dequantize();
  if (c.dtype() == DType::f32 && c.is_contiguous()) {
    kernels::grouped_matmul_forward(c, a, w.along_k, offsets);
    return;
  }
  Tensor cf = f32_matrix(c.shape());
  kernels::grouped_matmul_forward(cf, a, w.along_k, offsets);
  store(c, cf, false);
}

void quantized_grouped_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const QuantizedRows& aq,
                                const QuantizedExperts& w, std::span<const int64_t> offsets,
                                std::span<const int64_t> tile_starts, bool accumulate_dw, bool accumulate_da) {
  ProfileScope prof("quantized_grouped_mm.bwd");
  const LowPrecision recipe = w.recipe();
  const Tensor dcf = as_f32(dc);
  const Tensor none;
  if (da.defined()) {  // da = Q(dc along N) Q(w along N), per expert
    const bool direct = da.dtype() == DType::f32 && da.is_contiguous();
    const Tensor daf = direct ? da : f32_matrix(da.shape());
    // a is read only for dw: daf stands in for its shape.
    kernels::grouped_matmul_backward(daf, none, fake_quantize(dcf, recipe, QuantRole::activation, true), daf,
                                     w.along_m, offsets, false, direct && accumulate_da);
    if (!direct) store(da, daf, accumulate_da);
  }
  if (dw.defined()) {  // dw = Q(dc along tokens)^T Q(a along tokens), the tiles restarting at tile_starts
    const Tensor dcs = fake_quantize_token_tiles(dcf, recipe, tile_starts);
    const Tensor as = fake_quantize_token_tiles(aq.dequantize(), recipe, tile_starts);
    kernels::grouped_matmul_backward(none, dw, dcs, as, w.along_k, offsets, accumulate_dw, false);
  }
}

Tensor fake_quantize_token_tiles(const Tensor& t, LowPrecision recipe, std::span<const int64_t> tile_starts) {
  const int64_t rows = t.size(0);
  TITAN_CHECK(rows == 0 || (!tile_starts.empty() && tile_starts.front() == 0),
              "token tiles: the first tile must start at row 0", "pass token_tile_starts' result");
  Tensor out = f32_matrix(t.shape());
  for (size_t i = 0; i < tile_starts.size(); ++i) {
    const int64_t begin = tile_starts[i], end = i + 1 < tile_starts.size() ? tile_starts[i + 1] : rows;
    TITAN_CHECK(begin <= end && end <= rows, "token tiles: starts must be sorted and within the rows");
    if (begin == end) continue;
    out.slice(0, begin, end).copy_(fake_quantize(t.slice(0, begin, end), recipe, QuantRole::activation, false));
  }
  return out;
}

std::vector<int64_t> token_tile_starts(std::span<const int64_t> offsets, std::span<const int64_t> row_group) {
  const int64_t rows = int64_t(row_group.size());
  TITAN_CHECK(!offsets.empty() && offsets.front() == 0 && offsets.back() == rows, "token tiles: offsets must run from 0 to the row count");
  std::vector<int64_t> starts;
  size_t e = 0;
  for (int64_t r = 0; r < rows; ++r) {
    bool segment_start = false;
    while (e < offsets.size() && offsets[e] <= r) segment_start |= offsets[e++] == r;
    if (segment_start || row_group[size_t(r)] != row_group[size_t(r - 1)]) starts.push_back(r);
  }
  return starts;
}

}  // namespace titan::autograd
