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

Tensor& GradSlot::ensure() {
  if (!grad.defined()) {
    // Leaves (parameters) keep f32 gradients whatever their storage; intermediate gradients
    // follow their activation's dtype.
    const DType dt = dtype_is_float(dtype) && !is_leaf ? dtype : DType::f32;
    grad = Tensor::zeros(shape, dt, is_leaf ? MemCategory::gradients : MemCategory::temporaries);
  }
  return grad;
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
  if (impl_ && impl_->slot->grad.defined()) impl_->slot->grad.zero_();
}

void Variable::clear_grad() {
  if (impl_) impl_->slot->grad = Tensor();
}

// ---- tape ----------------------------------------------------------------------------------

namespace {
thread_local Tape* g_tape = nullptr;
thread_local bool g_grad_enabled = true;
}  // namespace

Tape& current_tape() {
  thread_local Tape root;
  return g_tape ? *g_tape : root;
}

TapeScope::TapeScope() : previous_(g_tape) { g_tape = &tape_; }
TapeScope::~TapeScope() { g_tape = previous_; }

bool grad_enabled() { return g_grad_enabled; }
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
    if (any) {
      GradSink sink(node->inputs);
      node->backward(grad_outputs, sink);
    }
    // The outputs' gradients were consumed by this node (every later use was recorded after it
    // and so has already run); release them unless the output is a leaf someone holds.
    for (const auto& out : node->outputs)
      if (!out->is_leaf) out->grad = Tensor();
  }
}

std::vector<Variable> record(std::string name, std::vector<Variable> inputs, std::vector<Tensor> outputs,
                             BackwardFn backward) {
  bool needs = false;
  if (grad_enabled())
    for (const Variable& in : inputs) needs = needs || in.requires_grad();
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

Variable record(std::string name, std::vector<Variable> inputs, Tensor output,
                std::function<void(const Tensor& grad_output, GradSink& sink)> backward) {
  std::vector<Tensor> outs;
  outs.push_back(std::move(output));
  return record(std::move(name), std::move(inputs), std::move(outs),
                [bw = std::move(backward)](std::span<const Tensor> g, GradSink& sink) { bw(g[0], sink); })[0];
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
                                 const std::vector<Variable>& inputs) {
  // Forward without recording: the region's intermediate activations die when fn returns.
  std::vector<Tensor> out_values;
  {
    NoGradGuard no_grad;
    std::vector<Variable> detached;
    for (const Variable& in : inputs) detached.emplace_back(in.value(), false);
    for (Variable& v : fn(detached)) out_values.push_back(v.value());
  }
  return record("checkpoint", inputs, std::move(out_values),
                [fn, inputs](std::span<const Tensor> grad_outputs, GradSink& sink) {
                  // Recompute on a private tape, with fresh leaves standing for the inputs.
                  TapeScope scope;
                  std::vector<Variable> leaves;
                  for (const Variable& in : inputs) leaves.emplace_back(in.value(), in.requires_grad());
                  std::vector<Variable> outs = fn(leaves);
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
