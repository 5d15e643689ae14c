#include "titan/kernels/norm.h"

#include "titan/kernels/cpu/norm.h"
#include "titan/kernels/ref/norm.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::check_activation;
using detail::check_f32;
using detail::check_like;
using detail::dispatch_activation;
using detail::last_dim;
using detail::use_fast;

namespace {
// Data of an optional f32 parameter gradient [D]: nullptr when undefined.
float* optional_param_grad(Tensor& g, int64_t D, const char* op, const char* name) {
  if (!g.defined()) return nullptr;
  check_f32(g, D, op, name);
  return g.data<float>();
}

void check_eps(double eps, const char* op) {
  TITAN_CHECK(eps > 0, std::string(op) + ": eps must be positive, got " + std::to_string(eps),
              "use the model's norm_eps (e.g. 1e-5 or 1e-6)");
}
}  // namespace

void rmsnorm_forward(Tensor& y, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const char* op = "rmsnorm_forward";
  check_activation(x, op, "x");
  check_like(y, x, op, "y");
  check_eps(eps, op);
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  check_f32(w, D, op, "w");
  check_f32(rstd, N, op, "rstd");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(rmsnorm_forward<T>) : &ref::rmsnorm_forward<T>)(
        y.data<T>(), rstd.data<float>(), x.data<T>(), w.data<float>(), N, D, float(eps));
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& rstd, const Tensor& dy, const Tensor& x, const Tensor& w) {
  const char* op = "rmsnorm_backward";
  check_activation(x, op, "x");
  check_like(dy, x, op, "dy");
  check_like(dx, x, op, "dx");
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  check_f32(w, D, op, "w");
  check_f32(rstd, N, op, "rstd");
  float* dw_data = optional_param_grad(dw, D, op, "dw");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(rmsnorm_backward<T>) : &ref::rmsnorm_backward<T>)(
        dx.data<T>(), dw_data, rstd.data<float>(), dy.data<T>(), x.data<T>(), w.data<float>(), N, D);
  });
}

void layernorm_forward(Tensor& y, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w, const Tensor& b,
                       double eps) {
  const char* op = "layernorm_forward";
  check_activation(x, op, "x");
  check_like(y, x, op, "y");
  check_eps(eps, op);
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  check_f32(w, D, op, "w");
  check_f32(b, D, op, "b");
  check_f32(mean, N, op, "mean");
  check_f32(rstd, N, op, "rstd");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(layernorm_forward<T>) : &ref::layernorm_forward<T>)(
        y.data<T>(), mean.data<float>(), rstd.data<float>(), x.data<T>(), w.data<float>(), b.data<float>(), N, D,
        float(eps));
  });
}

void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& x, const Tensor& w) {
  const char* op = "layernorm_backward";
  check_activation(x, op, "x");
  check_like(dy, x, op, "dy");
  check_like(dx, x, op, "dx");
  const int64_t D = last_dim(x, op), N = x.numel() / D;
  check_f32(w, D, op, "w");
  check_f32(mean, N, op, "mean");
  check_f32(rstd, N, op, "rstd");
  float* dw_data = optional_param_grad(dw, D, op, "dw");
  float* db_data = optional_param_grad(db, D, op, "db");
  dispatch_activation(x.dtype(), [&]<class T>() {
    (use_fast() ? TITAN_CPU_KERNEL(layernorm_backward<T>) : &ref::layernorm_backward<T>)(
        dx.data<T>(), dw_data, db_data, mean.data<float>(), rstd.data<float>(), dy.data<T>(), x.data<T>(),
        w.data<float>(), N, D);
  });
}

}  // namespace titan::kernels
