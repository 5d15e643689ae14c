#include "titan/kernels/reduce.h"

#include "titan/kernels/cpu/reduce.h"
#include "titan/kernels/ref/reduce.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::check_activation;
using detail::dispatch_activation;
using detail::last_dim;
using detail::use_fast;

namespace {
// A per-row tensor of x: N elements of x's dtype, contiguous.
void check_per_row(const Tensor& t, const Tensor& x, int64_t N, const char* op, const char* name) {
  check_activation(t, op, name);
  TITAN_CHECK(t.numel() == N && t.dtype() == x.dtype(),
              std::string(op) + ": " + name + " is " + t.str() + " but needs " + std::to_string(N) + " elements of " +
                  std::string(dtype_name(x.dtype())) + " (one per row of " + x.str() + ")",
              "per-row results have x's shape without its last dim");
}

void check_argmax(const Tensor& argmax, int64_t N, const char* op) {
  TITAN_CHECK(argmax.defined() && argmax.dtype() == DType::i32 && argmax.is_contiguous() && argmax.numel() == N,
              std::string(op) + ": argmax must be contiguous i32 with " + std::to_string(N) + " elements, got " +
                  (argmax.defined() ? argmax.str() : std::string("undefined")),
              "allocate it with x's shape without the last dim");
}

// Shared body of sum_rows and mean_rows (same checks, different kernels).
template <class Kernel>
void row_reduce(Tensor& y, const Tensor& x, const char* op, Kernel kernel) {
  check_activation(x, op, "x");
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  check_per_row(y, x, N, op, "y");
  dispatch_activation(x.dtype(), [&]<class T>() { kernel.template operator()<T>(y.data<T>(), x.data<T>(), N, D); });
}
}  // namespace

void sum_rows(Tensor& y, const Tensor& x) {
  row_reduce(y, x, "sum_rows", []<class T>(T* yp, const T* xp, int64_t N, int64_t D) {
    (use_fast() ? TITAN_CPU_KERNEL(sum_rows<T>) : &ref::sum_rows<T>)(yp, xp, N, D);
  });
}

void mean_rows(Tensor& y, const Tensor& x) {
  row_reduce(y, x, "mean_rows", []<class T>(T* yp, const T* xp, int64_t N, int64_t D) {
    (use_fast() ? TITAN_CPU_KERNEL(mean_rows<T>) : &ref::mean_rows<T>)(yp, xp, N, D);
  });
}

void sum_rows_backward(Tensor& dx, const Tensor& dy, double scale) {
  const char* op = "sum_rows_backward";
  check_activation(dx, op, "dx");
  const int64_t D = last_dim(dx, op), N = dx.numel() / D;
  check_per_row(dy, dx, N, op, "dy");
  dispatch_activation(dx.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(sum_rows_backward<T>) : &ref::sum_rows_backward<T>)(dx.data<T>(), dy.data<T>(),
                                                                                       float(scale), N, D);
  });
}

void max_rows(Tensor& y, Tensor& argmax, const Tensor& x) {
  const char* op = "max_rows";
  check_activation(x, op, "x");
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  TITAN_CHECK(D <= INT32_MAX, std::string(op) + ": last dim " + std::to_string(D) + " overflows an i32 index",
              "reduce over a view with a shorter last dim");
  check_per_row(y, x, N, op, "y");
  check_argmax(argmax, N, op);
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(max_rows<T>) : &ref::max_rows<T>)(y.data<T>(), argmax.data<int32_t>(),
                                                                     x.data<T>(), N, D);
  });
}

void max_rows_backward(Tensor& dx, const Tensor& argmax, const Tensor& dy) {
  const char* op = "max_rows_backward";
  check_activation(dx, op, "dx");
  const int64_t D = last_dim(dx, op), N = dx.numel() / D;
  check_per_row(dy, dx, N, op, "dy");
  check_argmax(argmax, N, op);
  dispatch_activation(dx.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(max_rows_backward<T>) : &ref::max_rows_backward<T>)(
        dx.data<T>(), argmax.data<int32_t>(), dy.data<T>(), N, D);
  });
}

double sum_all(const Tensor& x) {
  check_activation(x, "sum_all", "x");
  double s = 0;
  dispatch_activation(x.dtype(), [&]<class T>() {
    s = (use_fast() ? TITAN_CPU_KERNEL(sum_all<T>) : &ref::sum_all<T>)(x.data<T>(), x.numel());
  });
  return s;
}

double mean_all(const Tensor& x) {
  TITAN_CHECK(x.numel() > 0, "mean_all: x is empty", "the mean of no elements is undefined; check the batch");
  return sum_all(x) / double(x.numel());
}

void sum_all_backward(Tensor& dx, double dy) {
  check_activation(dx, "sum_all_backward", "dx");
  // One row of numel elements whose per-row gradient is 1 (exact in bf16) scaled by dy in f32,
  // so dy itself is never rounded to the activation dtype.
  dispatch_activation(dx.dtype(), [&]<class T>() {
    const T one = ref::store<T>(1.0f);
    (use_fast() ? TITAN_CPU_KERNEL(sum_rows_backward<T>) : &ref::sum_rows_backward<T>)(dx.data<T>(), &one,
                                                                                       float(dy), 1, dx.numel());
  });
}

double sum_squares(std::span<const Tensor> tensors) {
  double total = 0;
  for (const Tensor& t : tensors) {
    check_activation(t, "sum_squares", "tensor");
    dispatch_activation(t.dtype(), [&]<class T>() {
      total += (use_fast() ? TITAN_CPU_KERNEL(sum_squares<T>) : &ref::sum_squares<T>)(t.data<T>(), t.numel());
    });
  }
  return total;
}

}  // namespace titan::kernels
