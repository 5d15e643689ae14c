#include "titan/kernels/elementwise.h"

#include "titan/kernels/cpu/elementwise.h"
#include "titan/kernels/ref/elementwise.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::check_activation;
using detail::check_like;
using detail::dispatch_activation;
using detail::use_fast;

namespace {
// Data pointer of an optional gradient (nullptr when undefined), after checking it matches dy.
template <class T>
T* optional_grad(Tensor& g, const Tensor& dy, const char* op, const char* name) {
  if (!g.defined()) return nullptr;
  check_like(g, dy, op, name);
  return g.data<T>();
}
}  // namespace

void add(Tensor& y, const Tensor& a, const Tensor& b, double alpha) {
  check_activation(a, "add", "a");
  check_like(b, a, "add", "b");
  check_like(y, a, "add", "y");
  dispatch_activation(a.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(add<T>) : &ref::add<T>)(y.data<T>(), a.data<T>(), b.data<T>(), float(alpha),
                                                           a.numel());
  });
}

void add_backward(Tensor& da, Tensor& db, const Tensor& dy, double alpha) {
  check_activation(dy, "add_backward", "dy");
  dispatch_activation(dy.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(add_backward<T>) : &ref::add_backward<T>)(
        optional_grad<T>(da, dy, "add_backward", "da"), optional_grad<T>(db, dy, "add_backward", "db"),
        dy.data<T>(), float(alpha), dy.numel());
  });
}

void mul(Tensor& y, const Tensor& a, const Tensor& b) {
  check_activation(a, "mul", "a");
  check_like(b, a, "mul", "b");
  check_like(y, a, "mul", "y");
  dispatch_activation(a.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(mul<T>) : &ref::mul<T>)(y.data<T>(), a.data<T>(), b.data<T>(), a.numel());
  });
}

void mul_backward(Tensor& da, Tensor& db, const Tensor& dy, const Tensor& a, const Tensor& b) {
  check_activation(dy, "mul_backward", "dy");
  check_like(a, dy, "mul_backward", "a");
  check_like(b, dy, "mul_backward", "b");
  dispatch_activation(dy.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(mul_backward<T>) : &ref::mul_backward<T>)(
        optional_grad<T>(da, dy, "mul_backward", "da"), optional_grad<T>(db, dy, "mul_backward", "db"),
        dy.data<T>(), a.data<T>(), b.data<T>(), dy.numel());
  });
}

void scale(Tensor& y, const Tensor& x, double alpha) {
  check_activation(x, "scale", "x");
  check_like(y, x, "scale", "y");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(scale<T>) : &ref::scale<T>)(y.data<T>(), x.data<T>(), float(alpha), x.numel());
  });
}

void axpby(Tensor& y, const Tensor& x, double alpha, double beta) {
  check_activation(x, "axpby", "x");
  check_like(y, x, "axpby", "y");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(axpby<T>) : &ref::axpby<T>)(y.data<T>(), x.data<T>(), float(alpha), float(beta),
                                                               x.numel());
  });
}

}  // namespace titan::kernels
