#include "titan/optim/clip_grad.h"

#include <cmath>

#include "titan/kernels/reduce.h"

namespace titan::optim {

GradNorm clip_grad_norm(const std::vector<std::pair<std::string, nn::Parameter*>>& params, double max_norm) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const auto& [name, p] : params)
    if (p->var.grad().defined()) grads.push_back(p->var.grad());
  GradNorm out;
  out.norm = std::sqrt(kernels::sum_squares(grads));
  if (!std::isfinite(out.norm)) {
    for (const auto& [name, p] : params) {
      if (!p->var.grad().defined()) continue;
      const Tensor g = p->var.grad();
      TITAN_CHECK(std::isfinite(kernels::sum_squares(std::span<const Tensor>(&g, 1))),
                  "the gradient of '" + name + "' is not finite (inf or NaN)",
                  "lower optimizer.lr, raise lr_scheduler.warmup_steps, or set training.max_norm");
    }
  }
  if (max_norm > 0) out.scale = float(std::min(1.0, max_norm / (out.norm + 1e-6)));
  return out;
}

}  // namespace titan::optim
