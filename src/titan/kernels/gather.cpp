#include "titan/kernels/gather.h"

#include <string>

#include "titan/kernels/cpu/gather.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/gather.h"
#include "titan/kernels/row_buckets.h"

namespace titan::kernels {

void check_row_indices(const Tensor& idx, int64_t rows, const char* op, const char* what, const char* range,
                       const char* hint) {
  TITAN_CHECK(idx.dtype() == DType::i32 && idx.is_contiguous(),
              std::string(op) + ": indices must be contiguous i32, got " + idx.str(), "convert with .to(DType::i32)");
  const int32_t* p = idx.data<int32_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    TITAN_CHECK(p[i] >= 0 && p[i] < rows,
                std::string(op) + ": " + what + " " + std::to_string(p[i]) + " at position " + std::to_string(i) +
                    " is outside " + range + " [0, " + std::to_string(rows) + ")",
                hint);
  }
}

namespace {

struct RowsShape {
  int64_t r, m, d;  // rows of the gathered-from / scattered-to tensor, index count, row length
  DType dtype;
};

// Validates the pair (big [R, D], small [M, D]) plus idx and w; returns the sizes.
RowsShape check_rows(const char* op, const Tensor& big, const Tensor& small, const Tensor& idx, const Tensor& w) {
  TITAN_CHECK(big.dim() == 2 && small.dim() == 2 && big.size(1) == small.size(1),
              std::string(op) + ": expects [R, D] and [M, D] tensors, got " + big.str() + " and " + small.str(),
              "flatten leading dims with .view({-1, D})");
  TITAN_CHECK(big.dtype() == small.dtype() && (big.dtype() == DType::f32 || big.dtype() == DType::bf16),
              std::string(op) + ": tensors must share one dtype, f32 or bf16; got " + big.str() + " and " + small.str(),
              "cast with kernels::cast first");
  TITAN_CHECK(big.is_contiguous() && small.is_contiguous(), std::string(op) + ": tensors must be contiguous",
              "call .contiguous() first");
  TITAN_CHECK(idx.numel() == small.size(0),
              std::string(op) + ": " + std::to_string(idx.numel()) + " indices for " + std::to_string(small.size(0)) + " rows",
              "pass one index per row of the [M, D] tensor");
  check_row_indices(idx, big.size(0), op, "index", "the rows", "indices must address rows of the [R, D] tensor");
  if (w.defined()) {
    TITAN_CHECK(w.dtype() == DType::f32 && w.is_contiguous() && w.numel() == idx.numel(),
                std::string(op) + ": weights must be contiguous f32 with one entry per index, got " + w.str(),
                "router weights are f32 [M]");
  }
  return {big.size(0), small.size(0), big.size(1), big.dtype()};
}

void check_dw(const char* op, const Tensor& dw, const Tensor& w, int64_t m) {
  if (!dw.defined()) return;
  TITAN_CHECK(w.defined(), std::string(op) + ": dw given without weights w", "pass w, or leave dw undefined");
  TITAN_CHECK(dw.dtype() == DType::f32 && dw.is_contiguous() && dw.numel() == m,
              std::string(op) + ": dw must be contiguous f32 [" + std::to_string(m) + "], got " + dw.str(),
              "weight gradients are f32");
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

bool fast() { return kernel_backend() == KernelBackend::fast; }

template <class T>
void gather_forward_typed(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w, const RowsShape& s) {
  (fast() ? TITAN_CPU_KERNEL(gather_rows_forward<T>) : &ref::gather_rows_forward<T>)(
      y.data<T>(), x.data<T>(), idx.data<int32_t>(), data_or_null<float>(w), s.m, s.d);
}

template <class T>
void gather_backward_typed(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                           const Tensor& w, const RowsShape& s) {
  const int32_t* ip = idx.data<int32_t>();
  if (fast()) {
    const RowBuckets b = dx.defined() ? bucket_rows_by_index(ip, s.m, s.r) : RowBuckets{};
    TITAN_CPU_KERNEL(gather_rows_backward<T>)(data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(), x.data<T>(),
                                              ip, data_or_null<float>(w), b.view(), s.m, s.d);
  } else {
    ref::gather_rows_backward<T>(data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(), x.data<T>(), ip,
                                 data_or_null<float>(w), s.r, s.m, s.d);
  }
}

template <class T>
void scatter_forward_typed(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w, const RowsShape& s) {
  const int32_t* ip = idx.data<int32_t>();
  if (fast()) {
    const RowBuckets b = bucket_rows_by_index(ip, s.m, s.r);
    TITAN_CPU_KERNEL(scatter_add_rows_forward<T>)(y.data<T>(), x.data<T>(), data_or_null<float>(w), b.view(), s.d);
  } else {
    ref::scatter_add_rows_forward<T>(y.data<T>(), x.data<T>(), ip, data_or_null<float>(w), s.r, s.m, s.d);
  }
}

template <class T>
void scatter_backward_typed(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                            const Tensor& w, const RowsShape& s) {
  (fast() ? TITAN_CPU_KERNEL(scatter_add_rows_backward<T>) : &ref::scatter_add_rows_backward<T>)(
      data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(), x.data<T>(), idx.data<int32_t>(), data_or_null<float>(w),
      s.m, s.d);
}

}  // namespace

void gather_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w) {
  const RowsShape s = check_rows("gather_rows_forward", x, y, idx, w);
  if (s.dtype == DType::f32) {
    gather_forward_typed<float>(y, x, idx, w, s);
  } else {
    gather_forward_typed<bf16>(y, x, idx, w, s);
  }
}

void gather_rows_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                          const Tensor& w) {
  const RowsShape s = check_rows("gather_rows_backward", x, dy, idx, w);
  if (dx.defined()) {
    TITAN_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype() && dx.is_contiguous(),
                "gather_rows_backward: dx " + dx.str() + " must match x " + x.str(), "allocate dx like x");
  }
  check_dw("gather_rows_backward", dw, w, s.m);
  if (s.dtype == DType::f32) {
    gather_backward_typed<float>(dx, dw, dy, x, idx, w, s);
  } else {
    gather_backward_typed<bf16>(dx, dw, dy, x, idx, w, s);
  }
}

void scatter_add_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w) {
  const RowsShape s = check_rows("scatter_add_rows_forward", y, x, idx, w);
  if (s.dtype == DType::f32) {
    scatter_forward_typed<float>(y, x, idx, w, s);
  } else {
    scatter_forward_typed<bf16>(y, x, idx, w, s);
  }
}

void scatter_add_rows_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                               const Tensor& idx, const Tensor& w) {
  const RowsShape s = check_rows("scatter_add_rows_backward", dy, x, idx, w);
  if (dx.defined()) {
    TITAN_CHECK(dx.shape() == x.shape() && dx.dtype() == x.dtype() && dx.is_contiguous(),
                "scatter_add_rows_backward: dx " + dx.str() + " must match x " + x.str(), "allocate dx like x");
  }
  check_dw("scatter_add_rows_backward", dw, w, s.m);
  if (s.dtype == DType::f32) {
    scatter_backward_typed<float>(dx, dw, dy, x, idx, w, s);
  } else {
    scatter_backward_typed<bf16>(dx, dw, dy, x, idx, w, s);
  }
}

}  // namespace titan::kernels
