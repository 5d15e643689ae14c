#include "titan/kernels/softmax.h"

#include "titan/kernels/cpu/softmax.h"
#include "titan/kernels/ref/softmax.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::check_activation;
using detail::check_like;
using detail::dispatch_activation;
using detail::last_dim;
using detail::use_fast;

void softmax_forward(Tensor& y, const Tensor& x) {
  check_activation(x, "softmax_forward", "x");
  check_like(y, x, "softmax_forward", "y");
  const int64_t D = last_dim(x, "softmax_forward"), N = x.numel() / D;
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(softmax_forward<T>) : &ref::softmax_forward<T>)(y.data<T>(), x.data<T>(), N, D);
  });
}

void softmax_backward(Tensor& dx, const Tensor& dy, const Tensor& y) {
  check_activation(y, "softmax_backward", "y");
  check_like(dy, y, "softmax_backward", "dy");
  check_like(dx, y, "softmax_backward", "dx");
  const int64_t D = last_dim(y, "softmax_backward"), N = y.numel() / D;
  dispatch_activation(y.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(softmax_backward<T>) : &ref::softmax_backward<T>)(dx.data<T>(), dy.data<T>(),
                                                                                     y.data<T>(), N, D);
  });
}

}  // namespace titan::kernels
