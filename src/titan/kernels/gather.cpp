#include "titan/kernels/gather.h"

#include <string>

#include "titan/kernels/cpu/gather.h"
#include "titan/kernels/ref/gather.h"
#include "titan/kernels/row_buckets.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::check_activation;
using detail::check_f32;
using detail::dispatch_activation;
using detail::use_fast;

void check_row_indices(const Tensor& idx, int64_t rows, const char* op, const char* what, const char* hint,
                       const char* range) {
  TITAN_CHECK(idx.dtype() == DType::i32 && idx.is_contiguous(),
              std::string(op) + ": indices must be contiguous i32, got " + idx.str(), "convert with .to(DType::i32)");
  const int32_t* p = idx.data<int32_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    TITAN_CHECK(p[i] >= 0 && p[i] < rows,
                std::string(op) + ": " + what + " " + std::to_string(p[i]) + " at position " + std::to_string(i) +
                    " is outside " + (*range ? std::string(range) + " " : std::string()) + "[0, " +
                    std::to_string(rows) + ")",
                hint);
  }
}

namespace {

struct RowsShape {
  int64_t r, m, d;  // rows of the gathered-from / scattered-to tensor, index count, row length
};

// Validates the pair big [R, D] / small [M, D], the indices into big and the optional weights.
RowsShape check_rows(const char* op, const Tensor& big, const Tensor& small, const Tensor& idx, const Tensor& w) {
  check_activation(big, op, "the [R, D] tensor");
  check_activation(small, op, "the [M, D] tensor");
  TITAN_CHECK(big.dim() == 2 && small.dim() == 2 && big.size(1) == small.size(1) && big.dtype() == small.dtype(),
              std::string(op) + ": expects [R, D] and [M, D] tensors of one dtype, got " + big.str() + " and " +
                  small.str(),
              "flatten leading dims with .view({-1, D})");
  TITAN_CHECK(idx.numel() == small.size(0),
              std::string(op) + ": " + std::to_string(idx.numel()) + " indices for " + std::to_string(small.size(0)) +
                  " rows",
              "pass one index per row of the [M, D] tensor");
  check_row_indices(idx, big.size(0), op, "index", "indices must address rows of the [R, D] tensor", "the rows");
  if (w.defined()) check_f32(w, idx.numel(), op, "w");
  return {big.size(0), small.size(0), big.size(1)};
}

// The gradient outputs of a backward: dx like `like`, dw f32 [M] (which needs w); either may be
// undefined to skip it.
void check_grads(const char* op, const Tensor& dx, const Tensor& like, const Tensor& dw, const Tensor& w, int64_t m) {
  if (dx.defined()) detail::check_like(dx, like, op, "dx");
  if (!dw.defined()) return;
  TITAN_CHECK(w.defined(), std::string(op) + ": dw given without weights w", "pass w, or leave dw undefined");
  check_f32(dw, m, op, "dw");
}

template <class T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void gather_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w) {
  const RowsShape s = check_rows("gather_rows_forward", x, y, idx, w);
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(gather_rows_forward<T>) : &ref::gather_rows_forward<T>)(
        y.data<T>(), x.data<T>(), idx.data<int32_t>(), data_or_null<float>(w), s.m, s.d);
  });
}

void gather_rows_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                          const Tensor& w) {
  const char* op = "gather_rows_backward";
  const RowsShape s = check_rows(op, x, dy, idx, w);
  check_grads(op, dx, x, dw, w, s.m);
  const int32_t* ip = idx.data<int32_t>();
  dispatch_activation(x.dtype(), [&]<class T>() {
    if (use_fast()) {
      const RowBuckets b = dx.defined() ? bucket_rows_by_index(ip, s.m, s.r) : RowBuckets{};
      TITAN_CPU_KERNEL(gather_rows_backward<T>)(data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(),
                                                x.data<T>(), ip, data_or_null<float>(w), b.view(), s.m, s.d);
    } else {
      ref::gather_rows_backward<T>(data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(), x.data<T>(), ip,
                                   data_or_null<float>(w), s.r, s.m, s.d);
    }
  });
}

void scatter_add_rows_forward(Tensor& y, const Tensor& x, const Tensor& idx, const Tensor& w) {
  const RowsShape s = check_rows("scatter_add_rows_forward", y, x, idx, w);
  const int32_t* ip = idx.data<int32_t>();
  dispatch_activation(x.dtype(), [&]<class T>() {
    if (use_fast()) {
      const RowBuckets b = bucket_rows_by_index(ip, s.m, s.r);
      TITAN_CPU_KERNEL(scatter_add_rows_forward<T>)(y.data<T>(), x.data<T>(), data_or_null<float>(w), b.view(), s.d);
    } else {
      ref::scatter_add_rows_forward<T>(y.data<T>(), x.data<T>(), ip, data_or_null<float>(w), s.r, s.m, s.d);
    }
  });
}

void scatter_add_rows_backward(Tensor& dx, Tensor& dw, const Tensor& dy, const Tensor& x, const Tensor& idx,
                               const Tensor& w) {
  const char* op = "scatter_add_rows_backward";
  const RowsShape s = check_rows(op, dy, x, idx, w);
  check_grads(op, dx, x, dw, w, s.m);
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(scatter_add_rows_backward<T>) : &ref::scatter_add_rows_backward<T>)(
        data_or_null<T>(dx), data_or_null<float>(dw), dy.data<T>(), x.data<T>(), idx.data<int32_t>(),
        data_or_null<float>(w), s.m, s.d);
  });
}

}  // namespace titan::kernels
