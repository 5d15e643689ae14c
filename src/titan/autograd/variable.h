// Define-by-run autograd. A Variable is a tensor that may require a gradient; differentiable ops
// (autograd/ops.h) record one Node per call on the current Tape, holding the op's backward
// next to its forward (a lambda that captures, by name, the tensors it saves). backward() walks
// the tape in reverse. Gradients ACCUMULATE into .grad(): zero them once per optimizer step, and
// several micro-batches' backward passes add up (gradient accumulation).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::autograd {

// Where a Variable's gradient lives. The tape holds only these (never values), so an
// activation stays alive exactly as long as a user Variable or a backward that saved it needs it.
struct GradSlot {
  Tensor grad;
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = false;
  bool is_leaf = true;
  std::string name;
  // zero_grad() keeps the buffer without writing it: the gradient is zero and the buffer's
  // contents are stale until something zero-fills (ensure, current) or overwrites it (GradSink::
  // grad_to_write). A step's first backward then writes the big weight gradients outright: the
  // 132 MB memset of DeepSeek-V3 debugmodel's gradients took 10 ms of an 850 ms step.
  bool stale = false;
  // Allocates a zero gradient if absent (f32 in category `gradients` for leaves, i.e. parameters,
  // the value's dtype in `temporaries` for intermediates) and zero-fills a stale one.
  Tensor& ensure();
  // Allocates the gradient (as ensure, but uninitialized unless `zeroed`); it must be absent.
  Tensor& allocate(bool zeroed);
  // The gradient as it stands (undefined if none), a stale buffer zero-filled first.
  const Tensor& current();
};

class Variable {
 public:
  Variable() = default;
  explicit Variable(Tensor value, bool requires_grad = false, std::string name = {});

  bool defined() const { return impl_ != nullptr; }
  const Tensor& value() const { return impl_->value; }
  Tensor& mutable_value() { return impl_->value; }
  bool requires_grad() const { return impl_ && impl_->slot->requires_grad; }
  void set_requires_grad(bool r) { impl_->slot->requires_grad = r; }
  const std::string& name() const { return impl_->slot->name; }
  bool is_leaf() const { return impl_->slot->is_leaf; }

  // The gradient (undefined until something accumulates into it or ensure_grad() is called).
  const Tensor& grad() const { return impl_->slot->current(); }
  Tensor& ensure_grad();
  void zero_grad();   // keeps the buffer, makes the gradient zero (lazily: see GradSlot::stale)
  void clear_grad();  // releases the buffer

  const Shape& shape() const { return impl_->value.shape(); }
  DType dtype() const { return impl_->value.dtype(); }
  bool same(const Variable& o) const { return impl_ == o.impl_; }
  const std::shared_ptr<GradSlot>& slot() const { return impl_->slot; }

 private:
  friend Variable make_output(Tensor value, bool requires_grad);
  struct Impl {
    Tensor value;
    std::shared_ptr<GradSlot> slot;
  };
  std::shared_ptr<Impl> impl_;
};

// Gradients of a node's inputs, handed to its backward: grad(i) is input i's gradient buffer
// (allocated as zeros on first use), or an undefined tensor when input i needs no gradient.
class GradSink {
 public:
  explicit GradSink(std::span<const std::shared_ptr<GradSlot>> inputs) : inputs_(inputs) {}
  bool needs(size_t i) const { return inputs_[i]->requires_grad; }
  Tensor grad(size_t i) { return needs(i) ? inputs_[i]->ensure() : Tensor(); }
  // Input i's gradient for a kernel that can either add to it or overwrite all of it: returns
  // the buffer and sets *accumulate. False means the gradient is zero, and the buffer either
  // stale (after zero_grad) or freshly allocated uninitialized (input i had none yet: the usual
  // single-consumer case): the kernel must write every element. Saves a zero-fill and its
  // read-back. Undefined when input i needs no gradient.
  Tensor grad_to_write(size_t i, bool* accumulate);
  // When input i needs a gradient and has none yet, makes `g` its gradient without copying and
  // returns true (the caller must not reuse g); otherwise returns false (accumulate instead).
  // For kernels that write several inputs' gradients under one write/add switch (grad_to_write
  // serves one input at a time).
  bool adopt(size_t i, const Tensor& g);
  // Whether adopt(i, ...) would succeed now: a kernel can then write input i's gradient into a
  // fresh uninitialized buffer instead of adding to a zero-filled one.
  bool can_adopt(size_t i) const;
  // Input i's gradient slot, for work that writes its gradient later (DeferWeightGrads).
  const std::shared_ptr<GradSlot>& slot(size_t i) const { return inputs_[i]; }

 private:
  std::span<const std::shared_ptr<GradSlot>> inputs_;
};

// backward(grad_outputs, sink): grad_outputs[k] is output k's gradient (undefined if nothing
// flowed into it); accumulate (+=) into sink.grad(i).
using BackwardFn = std::function<void(std::span<const Tensor> grad_outputs, GradSink& sink)>;

struct Node {
  std::string name;
  std::vector<std::shared_ptr<GradSlot>> inputs;
  std::vector<std::shared_ptr<GradSlot>> outputs;
  BackwardFn backward;
};

class Tape {
 public:
  void record(std::shared_ptr<Node> node) { nodes_.push_back(std::move(node)); }
  size_t size() const { return nodes_.size(); }
  // Runs every recorded node's backward in reverse order, releasing each node (and what it saved)
  // and intermediate gradients as soon as they are consumed. The tape is empty afterwards.
  void run_backward();
  void clear() { nodes_.clear(); }

 private:
  std::vector<std::shared_ptr<Node>> nodes_;
};

// The tape ops record on (per thread). A TapeScope installs a fresh tape for its lifetime.
Tape& current_tape();
class TapeScope {
 public:
  TapeScope();
  // Records on `tape` (which outlives the scope) instead: a pipeline stage's forward of one
  // micro-batch, whose backward runs later, between other micro-batches'.
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
  Tape& tape() { return *active_; }

 private:
  Tape tape_;
  Tape* active_;
  Tape* previous_;
};

// Zero-bubble pipeline schedules split a backward into the inputs' gradients, needed now by the
// previous stage, and the weights', which can wait (DualPipe's WeightGradStore). Inside a
// DeferWeightGrads scope, ops that support it (linear, the bulk of the work) compute their
// inputs' gradients and queue the GEMM of their weight's gradient; run() does the queued work,
// adding exactly what the backward would have. Other parameters' gradients are computed at once.
class WeightGradQueue {
 public:
  void push(std::function<void()> work) { work_.push_back(std::move(work)); }
  void run();  // in the order queued, then empty
  bool empty() const { return work_.empty(); }

 private:
  std::vector<std::function<void()>> work_;
};
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradQueue& queue);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradQueue* previous_;
};
// The queue weight gradients go to on this thread (null: compute them now).
WeightGradQueue* deferred_weight_grads();

// Recording is off inside a NoGradGuard (evaluation, optimizer updates, recompute forwards).
bool grad_enabled();
// True while checkpoint() runs its region the first time: grad mode is off there, but it is a
// training forward whose graph the backward rebuilds. Layers that form training-only outputs
// (e.g. an auxiliary loss returned by the region) form them then too.
bool in_checkpointed_forward();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();

 private:
  bool previous_;
};

// A Variable that is not a leaf, as an op's output is: its gradient keeps the value's dtype
// (bf16 under mixed precision) and lives in `temporaries`. It stands for a value another graph
// produced: a checkpoint's input in its recompute, a pipeline stage's input.
Variable make_output(Tensor value, bool requires_grad);

// Records an op with inputs and already-computed outputs. Returns the outputs as Variables;
// they require a gradient (and a node is recorded) only when grad mode is on and some input
// requires one.
std::vector<Variable> record(std::string name, std::vector<Variable> inputs, std::vector<Tensor> outputs,
                             BackwardFn backward);
Variable record(std::string name, std::vector<Variable> inputs, Tensor output,
                std::function<void(const Tensor& grad_output, GradSink& sink)> backward);

// Records a hook on the current tape: backward runs `fn` when it reaches this point (every node
// recorded after it has run, none recorded before it yet), whether or not gradients flow there.
// Parallel wrappers mark where a unit's backward begins and ends this way (FSDP's re-gather
// before a block's backward, its gradient reduce-scatter after). Recorded only in grad mode.
void record_hook(std::string name, std::function<void()> fn);

// Seeds `output` with `grad_output` (default: ones, for a scalar loss) and runs the current
// tape's backward.
void backward(Variable& output, const Tensor& grad_output = Tensor());

// Activation checkpointing: runs fn without keeping its intermediate activations; the backward
// pass runs fn again (with recording on) and backpropagates through that recomputation. fn must
// be deterministic; Variables it captures (e.g. weights) receive their gradients as usual, even
// when no input requires a gradient (the region is recorded whenever grad mode is on).
// save_expensive is TorchTitan's per-op selective checkpointing: the first pass keeps the outputs
// of the ops that go through keep_or_compute (GEMMs, attention), and the recompute reuses them, so
// the backward recomputes only the cheap ops (norms, activations, RoPE, copies) between them.
enum class CheckpointPolicy { recompute_all, save_expensive };
std::vector<Variable> checkpoint(const std::function<std::vector<Variable>(const std::vector<Variable>&)>& fn,
                                 const std::vector<Variable>& inputs,
                                 CheckpointPolicy policy = CheckpointPolicy::recompute_all);

// For expensive ops (the tensors `compute` returns are the op's outputs and the statistics its
// backward saves): outside a save_expensive region, compute(); inside one, the first pass also
// keeps the result and the recompute returns it without computing again.
std::vector<Tensor> keep_or_compute(const std::function<std::vector<Tensor>()>& compute);

}  // namespace titan::autograd
