#include "titan/autograd/variable.h"

#include <cstring>

namespace titan::autograd {

Variable::Variable(Tensor value, bool requires_grad, std::string name) : impl_(std::make_shared<Impl>()) {
  impl_->slot = std::make_shared<GradSlot>();
  impl_->slot->shape = value.shape();
  impl_->slot->dtype = value.dtype();
  impl_->slot->requires_grad = requires_grad;
  impl_->slot->name = std::move(name);
  impl_->value = std::move(value);
}

Variable make_output(Tensor value, bool requires_grad) {
  Variable v(std::move(value), requires_grad);
  v.impl_->slot->is_leaf = false;
  return v;
}

Tensor& GradSlot::allocate(bool zeroed) {
  // Leaves (parameters) keep f32 gradients whatever their storage; intermediate gradients
  // follow their activation's dtype.
  const DType dt = dtype_is_float(dtype) && !is_leaf ? dtype : DType::f32;
  const MemCategory category = is_leaf ? MemCategory::gradients : MemCategory::temporaries;
  grad = zeroed ? Tensor::zeros(shape, dt, category) : Tensor::empty(shape, dt, category);
  stale = false;
  return grad;
}

Tensor& GradSlot::ensure() {
  if (!grad.defined()) return allocate(true);
  current();
  return grad;
}

const Tensor& GradSlot::current() {
  if (stale) {
    grad.zero_();
    stale = false;
  }
  return grad;
}

Tensor GradSink::grad_to_write(size_t i, bool* accumulate) {
  *accumulate = true;
  if (!needs(i)) return Tensor();
  GradSlot& in = *inputs_[i];
  if (!in.grad.defined() || in.stale) {
    *accumulate = false;
    if (!in.grad.defined()) return in.allocate(false);
    in.stale = false;
    return in.grad;
  }
  return in.grad;
}

Tensor& Variable::ensure_grad() {
  TITAN_CHECK(impl_, "gradient of an undefined Variable");
  return impl_->slot->ensure();
}

bool GradSink::can_adopt(size_t i) const {
  const GradSlot& in = *inputs_[i];
  return in.requires_grad && !in.grad.defined() && !in.is_leaf;
}

bool GradSink::adopt(size_t i, const Tensor& g) {
  GradSlot& in = *inputs_[i];
  if (!in.requires_grad || in.grad.defined() || in.is_leaf) return false;
  TITAN_CHECK(g.shape() == in.shape, "adopted gradient shape " + g.shape().str() + " differs from " + in.shape.str());
  in.grad = g;
  return true;
}

void Variable::zero_grad() {
  if (impl_ && impl_->slot->grad.defined()) impl_->slot->stale = true;
}

void Variable::clear_grad() {
  if (impl_) impl_->slot->grad = Tensor(), impl_->slot->stale = false;
}

// ---- tape ----------------------------------------------------------------------------------

namespace {
thread_local Tape* g_tape = nullptr;
thread_local bool g_grad_enabled = true;
thread_local bool g_checkpoint_forward = false;
// Selective checkpointing: the region's store of expensive ops' outputs, filled by its first pass
// and read back in order by its recompute (replay). Null outside such a region.
struct SavedOutputs {
  std::vector<std::vector<Tensor>>* store = nullptr;
  bool replay = false;
  size_t next = 0;
};
thread_local SavedOutputs g_saved;
}  // namespace

Tape& current_tape() {
  thread_local Tape root;
  return g_tape ? *g_tape : root;
}

TapeScope::TapeScope() : active_(&tape_), previous_(g_tape) { g_tape = active_; }
TapeScope::TapeScope(Tape& tape) : active_(&tape), previous_(g_tape) { g_tape = active_; }
TapeScope::~TapeScope() { g_tape = previous_; }

namespace {
thread_local WeightGradQueue* g_weight_grads = nullptr;
}  // namespace

void WeightGradQueue::run() {
  std::vector<std::function<void()>> work = std::move(work_);
  work_.clear();
  for (auto& w : work) w();
}
DeferWeightGrads::DeferWeightGrads(WeightGradQueue& queue) : previous_(g_weight_grads) { g_weight_grads = &queue; }
DeferWeightGrads::~DeferWeightGrads() { g_weight_grads = previous_; }
WeightGradQueue* deferred_weight_grads() { return g_weight_grads; }

bool grad_enabled() { return g_grad_enabled; }
bool in_checkpointed_forward() { return g_checkpoint_forward; }

std::vector<Tensor> keep_or_compute(const std::function<std::vector<Tensor>()>& compute) {
  if (g_saved.store == nullptr) return compute();
  if (!g_saved.replay) {
    std::vector<Tensor> out = compute();
    g_saved.store->push_back(out);
    return out;
  }
  TITAN_CHECK(g_saved.next < g_saved.store->size(),
              "selective checkpointing: the recompute ran more saved ops than the first pass",
              "the checkpointed function must run the same ops in the same order each time");
  return (*g_saved.store)[g_saved.next++];
}
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

void Tape::run_backward() {
  std::vector<Tensor> grad_outputs;
  while (!nodes_.empty()) {
    std::shared_ptr<Node> node = std::move(nodes_.back());
    nodes_.pop_back();
    grad_outputs.clear();
    bool any = false;
    for (const auto& out : node->outputs) {
      grad_outputs.push_back(out->grad);
      any = any || out->grad.defined();
    }
    if (any || node->outputs.empty()) {  // a hook (record_hook) has no outputs and always runs
      GradSink sink(node->inputs);
      node->backward(grad_outputs, sink);
    }
    // The outputs' gradients were consumed by this node (every later use was recorded after it
    // and so has already run); release them unless the output is a leaf someone holds.
    for (const auto& out : node->outputs)
      if (!out->is_leaf) out->grad = Tensor();
  }
}

namespace {

std::vector<Variable> record_if(bool needs, std::string name, std::vector<Variable> inputs, std::vector<Tensor> outputs,
                                BackwardFn backward) {
  std::vector<Variable> outs;
  outs.reserve(outputs.size());
  for (Tensor& t : outputs) outs.push_back(make_output(std::move(t), needs));
  if (needs) {
    auto node = std::make_shared<Node>();
    node->name = std::move(name);
    for (const Variable& in : inputs) node->inputs.push_back(in.slot());
    for (const Variable& out : outs) node->outputs.push_back(out.slot());
    node->backward = std::move(backward);
    current_tape().record(std::move(node));
  }
  return outs;
}

}  // namespace

std::vector<Variable> record(std::string name, std::vector<Variable> inputs, std::vector<Tensor> outputs,
                             BackwardFn backward) {
  bool needs = false;
  if (grad_enabled())
    for (const Variable& in : inputs) needs = needs || in.requires_grad();
  return record_if(needs, std::move(name), std::move(inputs), std::move(outputs), std::move(backward));
}

Variable record(std::string name, std::vector<Variable> inputs, Tensor output,
                std::function<void(const Tensor& grad_output, GradSink& sink)> backward) {
  std::vector<Tensor> outs;
  outs.push_back(std::move(output));
  return record(std::move(name), std::move(inputs), std::move(outs),
                [bw = std::move(backward)](std::span<const Tensor> g, GradSink& sink) { bw(g[0], sink); })[0];
}

void record_hook(std::string name, std::function<void()> fn) {
  if (!grad_enabled()) return;
  auto node = std::make_shared<Node>();
  node->name = std::move(name);
  node->backward = [fn = std::move(fn)](std::span<const Tensor>, GradSink&) { fn(); };
  current_tape().record(std::move(node));
}

void backward(Variable& output, const Tensor& grad_output) {
  TITAN_CHECK(output.requires_grad(), "backward() of a Variable that does not require a gradient",
              "make sure some input (e.g. a parameter) has requires_grad and grad mode is on");
  Tensor& g = output.ensure_grad();
  if (grad_output.defined()) {
    TITAN_CHECK(grad_output.shape() == g.shape(), "backward(): grad_output shape " + grad_output.shape().str() +
                                                      " differs from the output's " + g.shape().str());
    g.copy_(grad_output);
  } else {
    TITAN_CHECK(output.value().numel() == 1, "backward() without grad_output needs a scalar output, got " +
                                                 output.shape().str(), "pass grad_output explicitly");
    g.fill_(1.0);
  }
  current_tape().run_backward();
}

std::vector<Variable> checkpoint(const std::function<std::vector<Variable>(const std::vector<Variable>&)>& fn,
                                 const std::vector<Variable>& inputs, CheckpointPolicy policy) {
  // Forward without recording: the region's intermediate activations die when fn returns, but
  // under save_expensive the outputs of keep_or_compute's ops stay in `saved` for the recompute.
  std::vector<Tensor> out_values;
  const bool training = grad_enabled();
  auto saved = std::make_shared<std::vector<std::vector<Tensor>>>();
  {
    NoGradGuard no_grad;
    const bool outer_forward = g_checkpoint_forward;
    const SavedOutputs outer_saved = g_saved;
    g_checkpoint_forward = training;
    g_saved = {training && policy == CheckpointPolicy::save_expensive ? saved.get() : nullptr, false, 0};
    struct Restore {
      bool forward;
      SavedOutputs saved;
      ~Restore() { g_checkpoint_forward = forward, g_saved = saved; }
    } restore{outer_forward, outer_saved};
    std::vector<Variable> detached;
    for (const Variable& in : inputs) detached.emplace_back(in.value(), false);
    for (Variable& v : fn(detached)) out_values.push_back(v.value());
  }
  // Recorded whenever grad mode is on, even when no input needs a gradient: parameters inside the
  // region may (a block after a frozen embedding, or DeepSeek-V3.2's indexers in the warm-up).
  return record_if(training, "checkpoint", inputs, std::move(out_values),
                [fn, inputs, saved](std::span<const Tensor> grad_outputs, GradSink& sink) {
                  // Recompute on a private tape, with fresh leaves standing for the inputs (and the
                  // saved outputs standing for their ops), then free what the first pass kept.
                  TapeScope scope;
                  std::vector<Variable> leaves;
                  // Not leaves to the tape: their gradients keep the activations' dtype (bf16
                  // under mixed precision), as the ops inside expect of their inputs' gradients.
                  for (const Variable& in : inputs) leaves.push_back(make_output(in.value(), in.requires_grad()));
                  std::vector<Variable> outs;
                  {
                    const SavedOutputs outer_saved = g_saved;
                    g_saved = {saved->empty() ? nullptr : saved.get(), true, 0};
                    struct Restore {
                      SavedOutputs saved;
                      ~Restore() { g_saved = saved; }
                    } restore{outer_saved};
                    outs = fn(leaves);
                    TITAN_CHECK(saved->empty() || g_saved.next == saved->size(),
                                "selective checkpointing: the recompute ran fewer saved ops than the first pass",
                                "the checkpointed function must run the same ops in the same order each time");
                  }
                  saved->clear();
                  TITAN_CHECK(outs.size() == grad_outputs.size(), "checkpointed function changed its number of outputs");
                  for (size_t k = 0; k < outs.size(); ++k)
                    if (grad_outputs[k].defined() && outs[k].requires_grad()) outs[k].ensure_grad().copy_(grad_outputs[k]);
                  scope.tape().run_backward();
                  for (size_t i = 0; i < leaves.size(); ++i) {
                    if (!sink.needs(i) || !leaves[i].grad().defined()) continue;
                    Tensor g = sink.grad(i);
                    const Tensor& lg = leaves[i].grad();
                    // g += lg, element-wise in f32 (gradients are small tensors' worth of work here).
                    Tensor acc = g.dtype() == DType::f32 ? g : g.to(DType::f32);
                    Tensor add = lg.dtype() == DType::f32 ? lg : lg.to(DType::f32);
                    float* a = acc.data<float>();
                    const float* b = add.data<float>();
                    for (int64_t e = 0; e < acc.numel(); ++e) a[e] += b[e];
                    if (!acc.shares_storage(g)) g.copy_(acc);
                  }
                });
}

}  // namespace titan::autograd
