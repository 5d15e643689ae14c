#include "titan/optim/adamw.h"

#include <cmath>
#include <cstring>

#include "titan/kernels/adamw.h"
#include "titan/kernels/cast.h"
#include "titan/optim/swapped_moments.h"

namespace titan::optim {

AdamW::AdamW(std::vector<nn::TrainableParam> params, const kernels::AdamWParams& config, const std::optional<Swap>& swap)
    : config_(config) {
  std::vector<int64_t> sizes;
  for (nn::TrainableParam& p : params) {
    const Shape s = p.var.value().shape();
    Slot slot;
    slot.param = std::move(p);
    if (!swap) {
      slot.exp_avg = Tensor::zeros(s, DType::f32, MemCategory::optimizer_state);
      slot.exp_avg_sq = Tensor::zeros(s, DType::f32, MemCategory::optimizer_state);
    }
    sizes.push_back(s.numel());
    slots_.push_back(std::move(slot));
  }
  if (swap)
    swapped_ = std::make_unique<SwappedMoments>(std::move(sizes), swap->chunk_bytes,
                                                std::make_unique<FileSwapStore>(swap->file));
}

AdamW::~AdamW() = default;

bool AdamW::prepare(Slot& s, float lr, float grad_scale) {
  s.updating = s.param.var.grad().defined();
  if (!s.updating) return false;
  if (swapped_) {  // update() reads them by pointer: what kernels::adamw_step checks for tensors
    const Tensor& g = s.param.var.grad();
    const Tensor& v = s.param.var.value();
    TITAN_CHECK(g.is_contiguous() && g.dtype() == DType::f32 && g.numel() == v.numel() && v.is_contiguous() &&
                    v.dtype() == DType::f32,
                "AdamW: parameter " + s.param.name + " and its gradient must be contiguous f32 of one size; got " +
                    v.str() + " and " + g.str());
  }
  ++s.steps;
  kernels::AdamWParams& a = s.constants;
  a = config_;
  a.lr = lr;
  a.grad_scale = grad_scale;
  a.bias_correction1 = float(1 - std::pow(double(config_.beta1), double(s.steps)));
  a.bias_correction2 = float(1 - std::pow(double(config_.beta2), double(s.steps)));
  a.weight_decay = s.param.weight_decay ? config_.weight_decay : 0.0f;
  return true;
}

void AdamW::update(Slot& s, int64_t begin, int64_t n, float* exp_avg, float* exp_avg_sq) {
  // The bf16 compute copy (mixed precision) is refreshed in the same pass over memory; an f16 one
  // (fp16 mixed precision) by a cast after it.
  Tensor* compute = s.param.compute && s.param.compute->defined() ? s.param.compute : nullptr;
  const bool fused = compute && compute->dtype() == DType::bf16;
  kernels::adamw_step(s.param.var.mutable_value().data<float>() + begin, exp_avg, exp_avg_sq,
                      fused ? compute->data<bf16>() + begin : nullptr, s.param.var.grad().data<float>() + begin, n,
                      s.constants);
  if (compute && !fused) {
    Tensor part = compute->view({compute->numel()}).slice(0, begin, begin + n);
    kernels::cast(part, s.param.var.value().view({compute->numel()}).slice(0, begin, begin + n));
  }
}

void AdamW::step(float lr, float grad_scale) {
  check_usable();
  ++step_;
  for (Slot& s : slots_) prepare(s, lr, grad_scale);
  if (swapped_) {
    // A step that fails midway (a write error) has updated some chunks and not others: the state
    // is no longer one step's, and every later use says so.
    broken_ = true;
    swapped_->for_each(SwappedMoments::Access::update, [this](const SwappedMoments::Piece& p) {
      Slot& s = slots_[size_t(p.tensor)];
      if (s.updating) update(s, p.begin, p.n, p.exp_avg, p.exp_avg_sq);
    });
    broken_ = false;
    return;
  }
  for (Slot& s : slots_) {
    if (!s.updating) continue;
    Tensor* compute = s.param.compute && s.param.compute->defined() ? s.param.compute : nullptr;
    const bool fused = compute && compute->dtype() == DType::bf16;  // f16: cast after the step
    kernels::adamw_step(s.param.var.mutable_value(), s.exp_avg, s.exp_avg_sq, fused ? compute : nullptr,
                        s.param.var.grad(), s.constants);
    if (compute && !fused) kernels::cast(*compute, s.param.var.value());
  }
}

int64_t AdamW::param_steps(const std::string& name) const {
  for (const Slot& s : slots_)
    if (s.param.name == name) return s.steps;
  TITAN_FAIL("AdamW::param_steps: no parameter '" + name + "' in this optimizer",
             "pass a name from the model's named_parameters()");
}

std::vector<std::pair<std::string, Shape>> AdamW::state_shapes() const {
  std::vector<std::pair<std::string, Shape>> out;
  for (const Slot& s : slots_) {
    const Shape shape = s.param.var.value().shape();
    out.emplace_back(s.param.name + ".exp_avg", shape);
    out.emplace_back(s.param.name + ".exp_avg_sq", shape);
    out.emplace_back(s.param.name + ".step", Shape{1});
  }
  out.emplace_back("step", Shape{1});
  return out;
}

void AdamW::check_usable() const {
  TITAN_CHECK(!broken_, "AdamW: a swapped optimizer step failed midway (" + swapped_->store().describe() +
                            "): the parameters and moments are no longer one step's",
              "restart from the last checkpoint once the swap file can be written (see [optimizer] swap_path)");
}

std::vector<std::pair<std::string, Tensor>> AdamW::state_dict() const {
  check_usable();
  std::vector<Tensor> m, v;
  for (const Slot& s : slots_) {
    if (!swapped_) {
      m.push_back(s.exp_avg);
      v.push_back(s.exp_avg_sq);
      continue;
    }
    m.push_back(Tensor::empty(s.param.var.value().shape(), DType::f32, MemCategory::temporaries));
    v.push_back(Tensor::empty(s.param.var.value().shape(), DType::f32, MemCategory::temporaries));
  }
  if (swapped_)
    swapped_->for_each(SwappedMoments::Access::read, [&](const SwappedMoments::Piece& p) {
      std::memcpy(m[size_t(p.tensor)].data<float>() + p.begin, p.exp_avg, size_t(p.n) * sizeof(float));
      std::memcpy(v[size_t(p.tensor)].data<float>() + p.begin, p.exp_avg_sq, size_t(p.n) * sizeof(float));
    });
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    out.emplace_back(s.param.name + ".exp_avg", m[i]);
    out.emplace_back(s.param.name + ".exp_avg_sq", v[i]);
    out.emplace_back(s.param.name + ".step", Tensor::full({1}, double(s.steps), DType::i64));
  }
  out.emplace_back("step", Tensor::full({1}, double(step_), DType::i64));
  return out;
}

SavedState AdamW::state_for_save() const {
  check_usable();
  SavedState out;
  for (const Slot& s : slots_) {
    const std::string& name = s.param.name;
    if (swapped_) {
      out.streamed.emplace_back(name + ".exp_avg", s.param.var.value().shape());
      out.streamed.emplace_back(name + ".exp_avg_sq", s.param.var.value().shape());
    } else {
      out.in_memory.emplace_back(name + ".exp_avg", s.exp_avg);
      out.in_memory.emplace_back(name + ".exp_avg_sq", s.exp_avg_sq);
    }
    out.in_memory.emplace_back(name + ".step", Tensor::full({1}, double(s.steps), DType::i64));
  }
  out.in_memory.emplace_back("step", Tensor::full({1}, double(step_), DType::i64));
  if (swapped_)  // keys 2i and 2i + 1: slot i's two moments
    out.stream = [moments = swapped_.get()](const SavedState::Emit& emit) {
      moments->for_each(SwappedMoments::Access::read, [&](const SwappedMoments::Piece& p) {
        emit(2 * size_t(p.tensor), p.begin, p.exp_avg, p.n);
        emit(2 * size_t(p.tensor) + 1, p.begin, p.exp_avg_sq, p.n);
      });
    };
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
  // Every tensor is checked before anything changes: a bad state leaves the optimizer as it was.
  std::vector<const Tensor*> m, v;
  std::vector<int64_t> steps;
  const int64_t step = int64_t(get("step", {1}).item());
  for (const Slot& s : slots_) {
    const Shape shape = s.param.var.value().shape();
    m.push_back(&get(s.param.name + ".exp_avg", shape));
    v.push_back(&get(s.param.name + ".exp_avg_sq", shape));
    // Checkpoints from before per-parameter counts: the global count is the best available.
    steps.push_back(state.count(s.param.name + ".step") ? int64_t(get(s.param.name + ".step", {1}).item()) : step);
  }
  step_ = step;
  broken_ = false;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!swapped_) {
      s.exp_avg.copy_(*m[i]);
      s.exp_avg_sq.copy_(*v[i]);
    }
    s.steps = steps[i];
  }
  if (swapped_) {
    std::vector<Tensor> mc, vc;  // contiguous f32 views of what was loaded
    for (size_t i = 0; i < slots_.size(); ++i) {
      for (auto [from, to] : {std::pair{m[i], &mc}, std::pair{v[i], &vc}})
        to->push_back(from->dtype() == DType::f32 ? from->contiguous() : from->to(DType::f32));
    }
    swapped_->for_each(SwappedMoments::Access::overwrite, [&](const SwappedMoments::Piece& p) {
      std::memcpy(p.exp_avg, mc[size_t(p.tensor)].data<float>() + p.begin, size_t(p.n) * sizeof(float));
      std::memcpy(p.exp_avg_sq, vc[size_t(p.tensor)].data<float>() + p.begin, size_t(p.n) * sizeof(float));
    });
  }
}

}  // namespace titan::optim
