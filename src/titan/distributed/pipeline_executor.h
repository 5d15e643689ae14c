// Runs a pipeline schedule (pipeline_schedule.h): one rank's action list for one optimizer step,
// whichever schedule made it. Each (stage, micro-batch) forward records on its own tape, so that
// its backward can run later, between other micro-batches' work; B seeds that tape with the
// gradient received from the next stage (and the stage's loss with the step's scale) and sends
// the input's gradient back; I does the same with the weights' GEMMs queued
// (autograd::DeferWeightGrads), and W runs the queue. Activations and gradients move by
// point-to-point sends on the pipeline group (tagged by kind, producing stage and micro-batch),
// or in memory between two stages of the same rank (the V turn). Receives are posted one compute
// action ahead, sends complete in the background: waiting happens only where data is needed.
// An overlapped pair (DualPipeV's F&B) runs as a ComputePair when asked (compute_pair.h): the
// forward on this thread, the backward on the pair's, taking turns at each expert-parallel
// all-to-all, so that each one's exchange hides under the other's compute.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "titan/autograd/variable.h"
#include "titan/distributed/compute_pair.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/process_group.h"

namespace titan::distributed::pp {

// What one stage's forward of one micro-batch produced.
struct StageForward {
  autograd::Variable output;  // the next stage's input (undefined on the last stage)
  // What the backward differentiates besides `output`: the last stage's loss, and any stage's
  // auxiliary losses (e.g. DeepSeek-V3.2's indexer KL); undefined when none. Its gradient seed is
  // the step's loss scale.
  autograd::Variable loss;
};

// The model side: the forward of `stage` (held by this rank) on micro-batch `microbatch`; input
// is the previous stage's output (undefined on stage 0). Called with recording on this
// (stage, micro-batch)'s tape.
using StageForwardFn = std::function<StageForward(int stage, int microbatch, const autograd::Variable& input)>;
// Called around each backward action (B, I or W) with it, e.g. to keep each micro-batch's
// gradients apart (train/pipeline_step.cpp).
struct BackwardHooks {
  std::function<void(const Action&)> before, after;
};

// Time spent per kind of action in the last step (compute only: waits for data are `waiting`),
// and per stage the seconds and counts of each kind, for the bubble measurement (bench_pipeline).
struct ExecutorTimes {
  // Seconds of one step: compute by kind, waiting for inputs and for sends to finish, handing
  // activations and gradients to the engine (send actions), and in all.
  double forward = 0, backward = 0, backward_input = 0, backward_weight = 0, waiting = 0, sending = 0, total = 0;
  int sends = 0;
  int handoffs = 0;  // turns passed inside overlapped pairs (0 unless they run as compute pairs)
  // Per action of this rank's list: a compute action's seconds (in a compute pair, the seconds its
  // piece held the turn), else 0.
  std::vector<double> action_seconds;
  // Per action of this rank's list: when it began, in seconds after the step's start (diagnostics;
  // a compute action after the wait for its input, a send or receive when the loop reached it).
  std::vector<double> action_start;
  double started = 0;  // the step's start on the steady clock (one machine's ranks share it)
  struct Stage {
    double seconds[4] = {0, 0, 0, 0};  // F, B, I, W
    int count[4] = {0, 0, 0, 0};
  };
  std::map<int, Stage> stages;
  double busy() const { return forward + backward + backward_input + backward_weight; }
};

class PipelineExecutor {
 public:
  // schedule: every rank's lists; pp: the pipeline group (its rank r runs actions[r]);
  // activation_shape / dtype: what a stage's input and output look like (every stage's the same:
  // the residual stream of one micro-batch). overlap_pairs: run each overlapped pair as a
  // ComputePair (else one action after the other).
  PipelineExecutor(Schedule schedule, const ProcessGroup& pp, Shape activation_shape, DType dtype,
                   bool overlap_pairs = false);
  // One step: every action of this rank in order. loss_scale seeds each loss's gradient (1 /
  // (micro-batches x data-parallel ranks x accumulation) for the mean over the global batch).
  void run_step(const StageForwardFn& forward, float loss_scale, const BackwardHooks& hooks = {});
  const Schedule& schedule() const { return schedule_; }
  bool runs_compute_pairs() const { return pair_ != nullptr; }
  const ExecutorTimes& times() const { return times_; }

 private:
  struct Slot {  // one (stage, micro-batch) on this rank
    autograd::Tape tape;
    autograd::Variable input;  // the stage's input leaf (undefined on stage 0)
    StageForward result;
    Tensor incoming_activation, incoming_gradient;  // receive buffers
    Work activation_arrived, gradient_arrived;
    bool activation_posted = false, gradient_posted = false;
    autograd::WeightGradQueue weight_grads;
  };
  Slot& slot(int stage, int microbatch);
  void post_receive(const Action& a);
  // The compute actions; each returns the seconds it waited for its input.
  double compute(const Action& a, const StageForwardFn& fn, float loss_scale, const BackwardHooks& hooks);
  double forward(const Action& a, const StageForwardFn& fn);
  double backward(const Action& a, float loss_scale, bool defer_weights);
  // The gradient of stage's output (waiting for it, adding the seconds to `waited`).
  Tensor gradient_for(int stage, int microbatch, double& waited);
  void charge(size_t index, const Action& a, double seconds);  // a compute action's time, by kind
  void send(const Action& a);
  int tag(Op kind, int stage, int microbatch) const;

  Schedule schedule_;
  const ProcessGroup& pp_;
  Shape shape_;
  DType dtype_;
  std::map<std::pair<int, int>, Slot> slots_;
  std::vector<Work> sends_;
  ExecutorTimes times_;
  std::unique_ptr<ComputePair> pair_;  // with overlap_pairs, for a schedule that has pairs
};

}  // namespace titan::distributed::pp
