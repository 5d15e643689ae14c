#include "titan/optim/clip_grad.h"

#include <cmath>

#include "titan/kernels/reduce.h"

namespace titan::optim {

GradNorm clip_grad_norm(const std::vector<std::pair<std::string, nn::Parameter*>>& params, double max_norm) {
  GradNorm out = clip_grad_norm(nn::trainable_params(params), max_norm, [](double x) { return x; });
  TITAN_CHECK(std::isfinite(out.norm), "the gradient of '" + out.nonfinite + "' is not finite (inf or NaN)",
              "lower optimizer.lr, raise lr_scheduler.warmup_steps, or set training.max_norm");
  return out;
}

GradNorm clip_grad_norm(const std::vector<nn::TrainableParam>& params, double max_norm,
                        const std::function<double(double)>& sum_over_shards) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const nn::TrainableParam& p : params)  // a gradient every TP rank holds counts once
    if (p.var.grad().defined() && !p.tp_duplicate) grads.push_back(p.var.grad());
  GradNorm out;
  out.norm = std::sqrt(sum_over_shards(kernels::sum_squares(grads)));
  if (!std::isfinite(out.norm)) {
    for (const nn::TrainableParam& p : params) {
      if (!p.var.grad().defined()) continue;
      const Tensor g = p.var.grad();
      if (!std::isfinite(kernels::sum_squares(std::span<const Tensor>(&g, 1)))) {
        out.nonfinite = p.name;
        break;
      }
    }
    return out;
  }
  if (max_norm > 0) out.scale = float(std::min(1.0, max_norm / (out.norm + 1e-6)));
  return out;
}

}  // namespace titan::optim
