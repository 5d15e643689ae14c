#include "titan/autograd/half_linear.h"

#include "titan/autograd/scratch_buffer.h"
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

// The GEMMs' widened operands and the f16 staging of a rounding, in buffers kept per thread from
// call to call: what half_linear allocates in a steady state is only its output and the f16 x
// that backward keeps.
enum Buffer { x32, w32, staging16, dy32, kBuffers };
ScratchBuffer& scratch(Buffer b) {
  thread_local ScratchBuffer buffers[kBuffers];
  return buffers[b];
}

// t cast to `dtype` into buffer b.
Tensor cast_into(Buffer b, const Tensor& t, DType dtype) {
  Tensor out = scratch(b).get(t.shape(), dtype);
  kernels::cast(out, t.contiguous());
  return out;
}

// out's values rounded to f16 in place (through the f16 staging buffer).
void round_in_place(Tensor& out) { kernels::cast(out, cast_into(staging16, out, DType::f16)); }

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
    kernels::linear_forward(out, cast_into(x32, x16, DType::f32), cast_into(w32, w_f16, DType::f32));
    round_in_place(out);  // the GEMM's f16 output: an overflow becomes infinity
    return std::vector<Tensor>{out};
  })[0];
  return record("linear", {x, w}, y, [x16, w_f16](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("linear.bwd");
    Tensor dy_f16 = cast_into(dy32, dy, DType::f32);
    round_in_place(dy_f16);
    const Tensor x_wide = cast_into(x32, x16, DType::f32), w_wide = cast_into(w32, w_f16, DType::f32);
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw), none;
    kernels::linear_backward(dx, dw, none, dy_f16, x_wide, w_wide, accumulate_dx, accumulate_dw);
  });
}

}  // namespace titan::autograd
