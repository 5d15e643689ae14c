#include "titan/distributed/ddp.h"

#include <cstring>

#include <fmt/format.h>

#include "titan/core/error.h"
#include "titan/kernels/cast.h"

namespace titan::distributed {

Ddp::Ddp(nn::Module& model, const std::vector<nn::ShardingUnit>& units, const ProcessGroup& group, int64_t bucket_bytes,
         bool pipeline, DType gradient_sync_dtype)
    : model_(model), group_(group), pipeline_(pipeline), sync_dtype_(gradient_sync_dtype) {
  const auto named = model.named_parameters();
  trainables_ = nn::trainable_params(named);
  // Each parameter's unit, by name prefix (the root unit: none).
  std::vector<std::vector<nn::Parameter*>> by_unit(units.size() + 1);
  for (const auto& [name, p] : named) {
    size_t owner = units.size();
    for (size_t i = 0; i < units.size(); ++i)
      if (name.starts_with(units[i].name + ".")) owner = i;
    by_unit[owner].push_back(p);
  }
  for (const nn::ShardingUnit& su : units) {
    units_.push_back(std::make_unique<Unit>());
    units_.back()->name = su.name;
    by_module_[su.module] = units_.back().get();
    su.module->set_unit_hooks(this);
    hooked_.push_back(su.module);
  }
  // Buckets in backward order; a bucket closes at the unit whose backward ends last in it.
  auto close = [&](std::vector<nn::Parameter*>& params, Unit* trigger) {
    if (params.empty()) return;
    Bucket b;
    int64_t n = 0;
    for (nn::Parameter* p : params) b.offsets.push_back(n), n += p->var.value().numel();
    b.flat = Tensor::zeros({n}, DType::f32, MemCategory::gradients);
    if (sync_dtype_ != DType::f32) b.wire = Tensor::zeros({n}, sync_dtype_, MemCategory::gradients);
    b.params = params;
    if (trigger) trigger->buckets.push_back(buckets_.size());
    buckets_.push_back(std::move(b));
    params.clear();
  };
  std::vector<nn::Parameter*> open;
  int64_t open_bytes = 0;
  for (size_t i = units.size(); i-- > 0;) {
    for (nn::Parameter* p : by_unit[i]) open.push_back(p), open_bytes += int64_t(p->var.value().nbytes());
    if (open_bytes >= bucket_bytes || i == 0) close(open, units_[i].get()), open_bytes = 0;
  }
  close(by_unit[units.size()], nullptr);  // the root's: reduced by finish_backward
}

Ddp::~Ddp() {
  for (nn::Module* m : hooked_) m->set_unit_hooks(nullptr);
  for (Bucket& b : buckets_) b.reduce.settle();
}

std::string Ddp::describe() const {
  return fmt::format("DDP over {} ranks ({} gradient buckets)", group_.size(), buckets_.size());
}

void Ddp::zero_grad() {
  // Gradients are views of the buckets, zero (stale) until backward writes them; frozen
  // parameters have none, so the optimizer skips them as on one rank.
  for (Bucket& b : buckets_)
    for (size_t i = 0; i < b.params.size(); ++i) {
      autograd::Variable& v = b.params[i]->var;
      if (!v.requires_grad()) {
        v.clear_grad();
        continue;
      }
      const std::shared_ptr<autograd::GradSlot>& slot = v.slot();
      const int64_t n = v.value().numel();
      if (!slot->grad.defined() || !slot->grad.shares_storage(b.flat))
        slot->grad = b.flat.slice(0, b.offsets[i], b.offsets[i] + n).view(v.shape());
      slot->stale = true;
    }
}

void Ddp::before_forward(const nn::Module& m) {
  if (!autograd::grad_enabled()) return;
  Unit& u = *by_module_.at(&m);
  ++u.uses;
  autograd::record_hook("ddp.post_backward " + u.name, [this, &u] { post_backward(u); });
}

void Ddp::post_backward(Unit& u) {
  if (--u.uses > 0 || !sync_ || pipeline_) return;
  for (size_t b : u.buckets) reduce(buckets_[b]);
}

void Ddp::attach(Bucket& b) {
  // A gradient summed elsewhere (a fresh tensor) is copied into its place in the bucket and
  // becomes a view of it again.
  for (size_t i = 0; i < b.params.size(); ++i) {
    const std::shared_ptr<autograd::GradSlot>& slot = b.params[i]->var.slot();
    if (!slot->grad.defined() || slot->grad.shares_storage(b.flat)) continue;
    const int64_t n = b.params[i]->var.value().numel();
    Tensor place = b.flat.slice(0, b.offsets[i], b.offsets[i] + n);
    std::memcpy(place.data_ptr(), slot->grad.contiguous().data_ptr(), size_t(n) * 4);
    slot->grad = place.view(b.params[i]->var.shape());
  }
}

void Ddp::reduce(Bucket& b) {
  // A parameter no gradient reached this step sends zeros (its buffer is stale or detached);
  // after the reduction every attached gradient holds the sum, other ranks' parts included.
  for (size_t i = 0; i < b.params.size(); ++i) {
    autograd::Variable& v = b.params[i]->var;
    const std::shared_ptr<autograd::GradSlot>& slot = v.slot();
    const bool attached = slot->grad.defined() && slot->grad.shares_storage(b.flat);
    if (!attached || slot->stale) std::memset(static_cast<float*>(b.flat.data_ptr()) + b.offsets[i], 0, size_t(v.value().numel()) * 4);
    if (attached) slot->stale = false;
  }
  if (b.wire.defined()) kernels::cast(b.wire, b.flat);  // cast before; read back by finish_backward
  b.reduce = group_.all_reduce(b.wire.defined() ? b.wire : b.flat);
  b.reduced = true;
}

void Ddp::finish_backward() {
  for (auto& u : units_) {
    TITAN_CHECK(u->uses == 0, "DDP: the backward of unit " + u->name + " did not finish (its hook never ran)",
                "every forward of a unit must be part of the loss's backward");
  }
  if (!sync_) return;
  // The root's bucket, and any whose unit took no part this step, in bucket order on every rank.
  for (Bucket& b : buckets_) {
    if (pipeline_) attach(b);
    if (!b.reduced) reduce(b);
  }
  for (Bucket& b : buckets_) {
    b.reduce.wait();
    if (b.wire.defined()) kernels::cast(b.flat, b.wire);  // the sum (taken in f32, sent rounded) into f32
    b.reduced = false;
  }
}

void Ddp::finish_forward() {
  for (auto& u : units_) u->uses = 0;
}

}  // namespace titan::distributed
