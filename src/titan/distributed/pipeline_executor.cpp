#include "titan/core/clock.h"
#include "titan/distributed/pipeline_executor.h"

#include "titan/core/error.h"
#include "titan/core/profiler.h"

namespace titan::distributed::pp {

namespace {

// Charges a send action's time (the copy into a contiguous buffer, the hand-over) to `sending`.
struct SendTimer {
  explicit SendTimer(ExecutorTimes& t) : times(t), start(steady_seconds()) {}
  ~SendTimer() { times.sending += steady_seconds() - start, ++times.sends; }
  ExecutorTimes& times;
  double start;
};
}  // namespace

PipelineExecutor::PipelineExecutor(Schedule schedule, const ProcessGroup& pp, Shape activation_shape, DType dtype,
                                   bool overlap_pairs)
    : schedule_(std::move(schedule)), pp_(pp), shape_(std::move(activation_shape)), dtype_(dtype) {
  TITAN_CHECK(schedule_.ranks == pp_.size(), "pipeline schedule " + schedule_.name + " is for " +
                                                 std::to_string(schedule_.ranks) + " ranks, the pipeline group has " +
                                                 std::to_string(pp_.size()));
  check_schedule(schedule_);
  // MPI guarantees tags up to 32767: kinds x stages x micro-batches must fit.
  TITAN_CHECK(2 * schedule_.stages() * schedule_.microbatches <= 32767,
              "pipeline: " + std::to_string(schedule_.stages()) + " stages x " + std::to_string(schedule_.microbatches) +
                  " micro-batches need more message tags than MPI guarantees",
              "use fewer micro-batches per step (raise parallelism.pipeline_parallel_microbatch_size)");
  bool has_pairs = false;
  for (const Action& a : schedule_.actions[size_t(pp_.rank())]) has_pairs = has_pairs || a.overlapped;
  if (overlap_pairs && has_pairs) pair_ = std::make_unique<ComputePair>();
}

int PipelineExecutor::tag(Op kind, int stage, int microbatch) const {
  const int k = kind == Op::send_activation || kind == Op::recv_activation ? 0 : 1;
  return (k * schedule_.stages() + stage) * schedule_.microbatches + microbatch;
}

PipelineExecutor::Slot& PipelineExecutor::slot(int stage, int microbatch) { return slots_[{stage, microbatch}]; }

void PipelineExecutor::post_receive(const Action& a) {
  // A message names its producing stage: an activation is the input of stage + 1, a gradient
  // the output gradient of stage - 1.
  if (a.op == Op::recv_activation) {
    Slot& s = slot(a.stage + 1, a.microbatch);
    if (s.activation_posted) return;
    s.incoming_activation = Tensor::empty(shape_, dtype_, MemCategory::activations);
    s.activation_arrived = pp_.recv(s.incoming_activation, a.peer, tag(a.op, a.stage, a.microbatch));
    s.activation_posted = true;
  } else if (a.op == Op::recv_gradient) {
    Slot& s = slot(a.stage - 1, a.microbatch);
    if (s.gradient_posted) return;
    s.incoming_gradient = Tensor::empty(shape_, dtype_, MemCategory::temporaries);
    s.gradient_arrived = pp_.recv(s.incoming_gradient, a.peer, tag(a.op, a.stage, a.microbatch));
    s.gradient_posted = true;
  }
}

double PipelineExecutor::forward(const Action& a, const StageForwardFn& fn) {
  Slot& s = slot(a.stage, a.microbatch);
  double waited = 0;
  if (a.stage > 0) {
    Tensor in;
    if (schedule_.rank_of(a.stage - 1) == pp_.rank()) {  // the V turn: the other stage is ours
      in = slot(a.stage - 1, a.microbatch).result.output.value();
    } else {
      TITAN_CHECK(s.activation_posted, "pipeline: " + action_str(a) + " has no receive for its input");
      const double t0 = steady_seconds();
      s.activation_arrived.wait();
      waited = steady_seconds() - t0;
      in = s.incoming_activation;
      s.incoming_activation = Tensor();
    }
    s.input = autograd::make_output(in, true);
  }
  autograd::TapeScope scope(s.tape);
  s.result = fn(a.stage, a.microbatch, s.input);
  TITAN_CHECK(a.stage == schedule_.stages() - 1 || s.result.output.defined(),
              "pipeline: stage " + std::to_string(a.stage) + " returned no output for the next stage");
  return waited;
}

Tensor PipelineExecutor::gradient_for(int stage, int microbatch, double& waited) {
  if (stage == schedule_.stages() - 1) return Tensor();
  if (schedule_.rank_of(stage + 1) == pp_.rank()) {  // the V turn
    Slot& next = slot(stage + 1, microbatch);
    Tensor g = next.input.defined() && next.input.grad().defined() ? next.input.grad() : Tensor();
    next.input = autograd::Variable();
    return g;
  }
  Slot& s = slot(stage, microbatch);
  TITAN_CHECK(s.gradient_posted, "pipeline: the backward of stage " + std::to_string(stage) + " micro-batch " +
                                     std::to_string(microbatch) + " has no receive for its gradient");
  const double t0 = steady_seconds();
  s.gradient_arrived.wait();
  waited += steady_seconds() - t0;
  Tensor g = s.incoming_gradient;
  s.incoming_gradient = Tensor();
  return g;
}

double PipelineExecutor::backward(const Action& a, float loss_scale, bool defer_weights) {
  Slot& s = slot(a.stage, a.microbatch);
  double waited = 0;
  const Tensor g = gradient_for(a.stage, a.microbatch, waited);
  if (g.defined() && s.result.output.requires_grad()) s.result.output.ensure_grad().copy_(g.view(s.result.output.shape()));
  if (s.result.loss.defined() && s.result.loss.requires_grad()) s.result.loss.ensure_grad().fill_(double(loss_scale));
  // Run even when nothing was seeded (a stage frozen by a warm-up): ops without a gradient are
  // skipped, but hooks (FSDP's post-backward) still run, as on one rank.
  if (defer_weights) {
    autograd::DeferWeightGrads later(s.weight_grads);
    s.tape.run_backward();
  } else {
    s.tape.run_backward();
  }
  s.result = StageForward();
  return waited;
}

double PipelineExecutor::compute(const Action& a, const StageForwardFn& fn, float loss_scale,
                                 const BackwardHooks& hooks) {
  switch (a.op) {
    case Op::forward: {
      ProfileScope span("pipeline F");
      return forward(a, fn);
    }
    case Op::backward:
    case Op::backward_input: {
      ProfileScope span(a.op == Op::backward ? "pipeline B" : "pipeline I");
      if (hooks.before) hooks.before(a);
      const double waited = backward(a, loss_scale, a.op == Op::backward_input);
      if (hooks.after) hooks.after(a);
      return waited;
    }
    case Op::backward_weight: {
      ProfileScope span("pipeline W");
      if (hooks.before) hooks.before(a);
      slot(a.stage, a.microbatch).weight_grads.run();
      if (hooks.after) hooks.after(a);
      return 0;
    }
    default:
      TITAN_FAIL("pipeline: " + action_str(a) + " is not a compute action");
  }
}

void PipelineExecutor::charge(size_t index, const Action& a, double seconds) {
  const int kind = a.op == Op::forward ? 0 : a.op == Op::backward ? 1 : a.op == Op::backward_input ? 2 : 3;
  double* const by_kind[] = {&times_.forward, &times_.backward, &times_.backward_input, &times_.backward_weight};
  *by_kind[kind] += seconds;
  times_.action_seconds[index] = seconds;
  ExecutorTimes::Stage& st = times_.stages[a.stage];
  st.seconds[kind] += seconds;
  ++st.count[kind];
}

void PipelineExecutor::send(const Action& a) {
  const SendTimer timer(times_);
  Slot& s = slot(a.stage, a.microbatch);
  if (a.op == Op::send_activation) {
    const Tensor out = s.result.output.value().contiguous();
    TITAN_CHECK(out.numel() == shape_.numel() && out.dtype() == dtype_,
                "pipeline: stage " + std::to_string(a.stage) + " output " + out.str() + " is not the activation " +
                    shape_.str() + " " + std::string(dtype_name(dtype_)) + " the next stage expects");
    sends_.push_back(pp_.send(out, a.peer, tag(a.op, a.stage, a.microbatch)));
    return;
  }
  // The input's gradient; zeros when nothing flowed into it (a frozen stage, e.g. DSA's warm-up).
  Tensor g = s.input.defined() && s.input.grad().defined() ? s.input.grad().contiguous()
                                                           : Tensor::zeros(shape_, dtype_, MemCategory::temporaries);
  TITAN_CHECK(g.numel() == shape_.numel() && g.dtype() == dtype_,
              "pipeline: stage " + std::to_string(a.stage) + "'s input gradient " + g.str() +
                  " is not the activation " + shape_.str() + " " + std::string(dtype_name(dtype_)) + " expected");
  sends_.push_back(pp_.send(g, a.peer, tag(a.op, a.stage, a.microbatch)));
  s.input = autograd::Variable();
}

void PipelineExecutor::run_step(const StageForwardFn& fn, float loss_scale, const BackwardHooks& hooks) {
  const std::vector<Action>& actions = schedule_.actions[size_t(pp_.rank())];
  std::vector<double> seconds = std::move(times_.action_seconds), starts = std::move(times_.action_start);
  times_ = ExecutorTimes();  // the two buffers kept from step to step
  seconds.assign(actions.size(), 0.0);
  starts.assign(actions.size(), 0.0);
  times_.action_seconds = std::move(seconds);
  times_.action_start = std::move(starts);
  const double start = steady_seconds();
  times_.started = start;
  slots_.clear();
  // Posts the receives up to (and after) the compute action at `from`: one compute action ahead.
  size_t posted_until = 0;
  const auto post_ahead = [&](size_t from) {
    bool passed_compute = false;
    for (size_t j = std::max(from, posted_until); j < actions.size(); ++j) {
      const Action& b = actions[j];
      if (is_compute(b.op) && !b.overlapped) {
        if (passed_compute) break;
        passed_compute = true;
      }
      if (b.op == Op::recv_activation || b.op == Op::recv_gradient) post_receive(b);
      posted_until = j + 1;
    }
  };
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    times_.action_start[i] = steady_seconds() - start;
    if (!is_compute(a.op)) {
      if (a.op == Op::send_activation || a.op == Op::send_gradient) send(a);
      else post_receive(a);  // already posted ahead, normally
      continue;
    }
    post_ahead(i);
    if (pair_ && i + 1 < actions.size() && actions[i + 1].overlapped) {
      // The pair: this action on this thread, its partner on the pair's, taking turns.
      const Action& b = actions[i + 1];
      double waited[2] = {0, 0};
      pair_->run([&] { waited[0] = compute(a, fn, loss_scale, hooks); },
                 [&] { waited[1] = compute(b, fn, loss_scale, hooks); });
      charge(i, a, pair_->held_seconds(0) - waited[0]);
      charge(i + 1, b, pair_->held_seconds(1) - waited[1]);
      // Taking turns, the two overlap; read as one after the other (each after its input's wait).
      const double top = times_.action_start[i];
      times_.action_start[i] = top + waited[0];
      times_.action_start[i + 1] = top + pair_->held_seconds(0) + waited[1];
      times_.waiting += waited[0] + waited[1];
      times_.handoffs += pair_->handoffs();
      ++i;
      continue;
    }
    // Compute time excludes the time spent waiting for the action's input.
    const double t0 = steady_seconds();
    const double waited = compute(a, fn, loss_scale, hooks);
    times_.action_start[i] = t0 + waited - start;  // the wait for its input comes first
    times_.waiting += waited;
    charge(i, a, steady_seconds() - t0 - waited);
  }
  const double t0 = steady_seconds();
  for (const Work& w : sends_) w.wait();
  sends_.clear();
  times_.waiting += steady_seconds() - t0;
  for (auto& [key, s] : slots_)
    TITAN_CHECK(s.weight_grads.empty(), "pipeline " + schedule_.name + ": stage " + std::to_string(key.first) +
                                            " micro-batch " + std::to_string(key.second) + " has weight gradients left");
  slots_.clear();
  times_.total = steady_seconds() - start;
}

}  // namespace titan::distributed::pp
