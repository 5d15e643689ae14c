#include "titan/autograd/hyper_connection.h"

#include <string>

#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/kernels/hyper_connection.h"

namespace titan::autograd {

namespace {

Tensor contiguous_f32(const Variable& v, const char* op) {
  TITAN_CHECK(v.dtype() == DType::f32, std::string(op) + ": mHC runs in f32, got " + v.value().str(),
              "cast the streams to f32 first");
  return v.value().contiguous();
}

Tensor activations(const Shape& shape) { return Tensor::empty(shape, DType::f32, MemCategory::activations); }

}  // namespace

Variable hc_weights(const Variable& mix, const Variable& base, const Variable& scale, int64_t n, double eps) {
  ProfileScope prof("hc_weights.fwd");
  const Tensor m = contiguous_f32(mix, "hc_weights"), b = contiguous_f32(base, "hc_weights"),
               s = contiguous_f32(scale, "hc_weights");
  Tensor w = activations(m.shape());
  kernels::hc_weights_forward(w, m, b, s, n, eps);
  return record("hc_weights", {mix, base, scale}, w, [m, b, s, n](const Tensor& dw, GradSink& g) {
    ProfileScope prof_bwd("hc_weights.bwd");
    Tensor dmix = g.grad(0), dbase = g.grad(1), dscale = g.grad(2);
    kernels::hc_weights_backward(dmix, dbase, dscale, dw.contiguous(), m, b, s, n);
  });
}

Variable hc_collapse(const Variable& x, const Variable& pre) {
  ProfileScope prof("hc_collapse.fwd");
  const Tensor xv = contiguous_f32(x, "hc_collapse"), pv = contiguous_f32(pre, "hc_collapse");
  TITAN_CHECK(xv.dim() == 3, "hc_collapse: x must be [T, N, d], got " + xv.str());
  Tensor u = activations({xv.size(0), xv.size(2)});
  kernels::hc_collapse_forward(u, xv, pv);
  return record("hc_collapse", {x, pre}, u, [xv, pv](const Tensor& du, GradSink& g) {
    ProfileScope prof_bwd("hc_collapse.bwd");
    Tensor dx = g.grad(0), dpre = g.grad(1);
    kernels::hc_collapse_backward(dx, dpre, du.contiguous(), xv, pv);
  });
}

Variable hc_expand(const Variable& x, const Variable& a, const Variable& post, const Variable& comb) {
  ProfileScope prof("hc_expand.fwd");
  const Tensor xv = contiguous_f32(x, "hc_expand"), av = contiguous_f32(a, "hc_expand"),
               pv = contiguous_f32(post, "hc_expand"), cv = contiguous_f32(comb, "hc_expand");
  Tensor y = activations(xv.shape());
  kernels::hc_expand_forward(y, xv, av, pv, cv);
  return record("hc_expand", {x, a, post, comb}, y, [xv, av, pv, cv](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("hc_expand.bwd");
    Tensor dx = g.grad(0), da = g.grad(1), dpost = g.grad(2), dcomb = g.grad(3);
    kernels::hc_expand_backward(dx, da, dpost, dcomb, dy.contiguous(), xv, av, pv, cv);
  });
}

}  // namespace titan::autograd
