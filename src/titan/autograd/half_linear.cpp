#include "titan/autograd/half_linear.h"

#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/cast.h"
#include "titan/kernels/matmul.h"

namespace titan::autograd {

namespace {

Tensor cast_to(const Tensor& t, DType dtype) {
  Tensor out = Tensor::empty(t.shape(), dtype, MemCategory::temporaries);
  kernels::cast(out, t.contiguous());
  return out;
}

}  // namespace

Tensor round_to_f16(const Tensor& t) { return cast_to(cast_to(t, DType::f16), DType::f32); }

Variable half_linear(const Variable& x, const Variable& w, const Tensor& w_f16) {
  ProfileScope prof("linear.fwd");
  TITAN_CHECK(x.dtype() == DType::f32 && w_f16.dtype() == DType::f16,
              "half_linear: activations must be f32 and the weight copy f16, not " + std::string(dtype_name(x.dtype())) +
                  " and " + std::string(dtype_name(w_f16.dtype())));
  TITAN_CHECK(x.value().size(-1) == w_f16.size(1), "linear: input width " + std::to_string(x.value().size(-1)) +
                                                       " does not match weight " + w_f16.shape().str() +
                                                       (w.name().empty() ? "" : " (" + w.name() + ")"));
  Shape ys = x.shape();
  ys[ys.size() - 1] = w_f16.size(0);
  const Tensor x16 = cast_to(x.value(), DType::f16);  // what backward keeps: 2 bytes a value
  const Tensor y = keep_or_compute([&] {
    Tensor out = Tensor::empty(ys, DType::f32, MemCategory::activations);
    kernels::linear_forward(out, cast_to(x16, DType::f32), cast_to(w_f16, DType::f32));
    Tensor rounded = cast_to(out, DType::f16);  // the GEMM's f16 output: an overflow becomes infinity
    kernels::cast(out, rounded);
    return std::vector<Tensor>{out};
  })[0];
  return record("linear", {x, w}, y, [x16, w_f16](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("linear.bwd");
    const Tensor dy16 = round_to_f16(dy), x32 = cast_to(x16, DType::f32), w32 = cast_to(w_f16, DType::f32);
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), none;
    kernels::linear_backward(dx, dw, none, dy16, x32, w32, accumulate_dx, accumulate_dw);
  });
}

}  // namespace titan::autograd
