#include "titan/optim/adamw.h"

#include <cmath>

#include "titan/kernels/adamw.h"

namespace titan::optim {

AdamW::AdamW(std::vector<nn::TrainableParam> params, const kernels::AdamWParams& config) : config_(config) {
  for (nn::TrainableParam& p : params) {
    const Shape s = p.var.value().shape();
    slots_.push_back({std::move(p), Tensor::zeros(s, DType::f32, MemCategory::optimizer_state),
                      Tensor::zeros(s, DType::f32, MemCategory::optimizer_state)});
  }
}

void AdamW::step(float lr, float grad_scale) {
  ++step_;
  kernels::AdamWParams a = config_;
  a.lr = lr;
  a.grad_scale = grad_scale;
  for (Slot& s : slots_) {
    if (!s.param.var.grad().defined()) continue;
    ++s.steps;
    a.bias_correction1 = float(1 - std::pow(double(config_.beta1), double(s.steps)));
    a.bias_correction2 = float(1 - std::pow(double(config_.beta2), double(s.steps)));
    a.weight_decay = s.param.weight_decay ? config_.weight_decay : 0.0f;
    // The bf16 compute copy (mixed precision) is refreshed in the same pass over memory.
    Tensor* compute = s.param.compute && s.param.compute->defined() ? s.param.compute : nullptr;
    kernels::adamw_step(s.param.var.mutable_value(), s.exp_avg, s.exp_avg_sq, compute, s.param.var.grad(), a);
  }
}

int64_t AdamW::param_steps(const std::string& name) const {
  for (const Slot& s : slots_)
    if (s.param.name == name) return s.steps;
  TITAN_FAIL("AdamW::param_steps: no parameter '" + name + "' in this optimizer",
             "pass a name from the model's named_parameters()");
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Slot& s : slots_) {
    out.emplace_back(s.param.name + ".exp_avg", s.exp_avg);
    out.emplace_back(s.param.name + ".exp_avg_sq", s.exp_avg_sq);
    out.emplace_back(s.param.name + ".step", Tensor::full({1}, double(s.steps), DType::i64));
  }
  out.emplace_back("step", Tensor::full({1}, double(step_), DType::i64));
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  auto get = [&](const std::string& key, const Shape& shape) -> const Tensor& {
    auto it = state.find(key);
    TITAN_CHECK(it != state.end(), "optimizer state '" + key + "' is missing from " + source,
                "resume from a checkpoint saved by the same model and optimizer");
    TITAN_CHECK(it->second.shape() == shape, "optimizer state '" + key + "' in " + source + " has shape " +
                                                 it->second.shape().str() + ", expected " + shape.str());
    return it->second;
  };
  step_ = int64_t(get("step", {1}).item());
  for (Slot& s : slots_) {
    s.exp_avg.copy_(get(s.param.name + ".exp_avg", s.exp_avg.shape()));
    s.exp_avg_sq.copy_(get(s.param.name + ".exp_avg_sq", s.exp_avg_sq.shape()));
    // Checkpoints from before per-parameter counts: the global count is the best available.
    s.steps = state.count(s.param.name + ".step") ? int64_t(get(s.param.name + ".step", {1}).item()) : step_;
  }
}

}  // namespace titan::optim
