#include "titan/kernels/adamw.h"

#include "titan/kernels/cpu/adamw.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/adamw.h"

namespace titan::kernels {

void adamw_step(Tensor& param, Tensor& exp_avg, Tensor& exp_avg_sq, Tensor* param_bf16, const Tensor& grad,
                const AdamWParams& a) {
  const int64_t n = param.numel();
  for (const Tensor* t : std::initializer_list<const Tensor*>{&param, &exp_avg, &exp_avg_sq, &grad}) {
    TITAN_CHECK(t->numel() == n && t->is_contiguous() && t->dtype() == DType::f32,
                "adamw_step: param, states and grad must be contiguous f32 of one size; got " + t->str());
  }
  bf16* pb = nullptr;
  if (param_bf16) {
    TITAN_CHECK(param_bf16->numel() == n && param_bf16->is_contiguous(), "adamw_step: bad bf16 parameter copy");
    pb = param_bf16->data<bf16>();
  }
  adamw_step(param.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), pb, grad.data<float>(), n, a);
}

void adamw_step(float* param, float* exp_avg, float* exp_avg_sq, bf16* param_bf16, const float* grad, int64_t n,
                const AdamWParams& a) {
  auto fn = kernel_backend() == KernelBackend::fast ? TITAN_CPU_KERNEL(adamw_step) : &ref::adamw_step;
  fn(param, exp_avg, exp_avg_sq, param_bf16, grad, n, a);
}

}  // namespace titan::kernels
