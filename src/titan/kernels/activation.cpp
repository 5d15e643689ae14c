#include "titan/kernels/activation.h"

#include <string>

#include "titan/kernels/cpu/activation.h"
#include "titan/kernels/ref/activation.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {
void check_limit(double limit, const char* op) {
  TITAN_CHECK(limit > 0, std::string(op) + ": swiglu limit " + std::to_string(limit),
              "the limit must be positive (kNoSwigluLimit: no clamp)");
}
}  // namespace

using detail::check_activation;
using detail::check_like;
using detail::dispatch_activation;
using detail::use_fast;

void silu_forward(Tensor& y, const Tensor& x) {
  check_activation(x, "silu_forward", "x");
  check_like(y, x, "silu_forward", "y");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(silu_forward<T>) : &ref::silu_forward<T>)(y.data<T>(), x.data<T>(), x.numel());
  });
}

void silu_backward(Tensor& dx, const Tensor& dy, const Tensor& x) {
  check_activation(x, "silu_backward", "x");
  check_like(dy, x, "silu_backward", "dy");
  check_like(dx, x, "silu_backward", "dx");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(silu_backward<T>) : &ref::silu_backward<T>)(dx.data<T>(), dy.data<T>(),
                                                                               x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor& y, const Tensor& gate, const Tensor& up, double limit) {
  check_limit(limit, "swiglu_forward");
  check_activation(gate, "swiglu_forward", "gate");
  check_like(up, gate, "swiglu_forward", "up");
  check_like(y, gate, "swiglu_forward", "y");
  dispatch_activation(gate.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(swiglu_forward<T>) : &ref::swiglu_forward<T>)(y.data<T>(), gate.data<T>(),
                                                                                 up.data<T>(), gate.numel(),
                                                                                 float(limit));
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dy, const Tensor& gate, const Tensor& up,
                     bool accumulate, double limit) {
  check_limit(limit, "swiglu_backward");
  check_activation(gate, "swiglu_backward", "gate");
  check_like(up, gate, "swiglu_backward", "up");
  check_like(dy, gate, "swiglu_backward", "dy");
  check_like(dgate, gate, "swiglu_backward", "dgate");
  check_like(dup, gate, "swiglu_backward", "dup");
  dispatch_activation(gate.dtype(), [&]<class T>() {
    if (use_fast()) {
      TITAN_CPU_KERNEL(swiglu_backward<T>)(dgate.data<T>(), dup.data<T>(), dy.data<T>(), gate.data<T>(), up.data<T>(),
                                           gate.numel(), accumulate, float(limit));
      return;
    }
    if (!accumulate) dgate.zero_(), dup.zero_();
    ref::swiglu_backward<T>(dgate.data<T>(), dup.data<T>(), dy.data<T>(), gate.data<T>(), up.data<T>(), gate.numel(),
                            float(limit));
  });
}

}  // namespace titan::kernels
