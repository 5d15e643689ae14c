#include "titan/train/pipeline_step.h"

#include "titan/autograd/variable.h"
#include "titan/core/error.h"
#include "titan/distributed/fsdp.h"
#include "titan/distributed/tree_sum.h"

namespace titan::train {

namespace pp = distributed::pp;

PipelinePlan plan_pipeline(const JobConfig& c, int64_t n_layers, int pp_rank, const std::string& source) {
  const Parallelism& p = c.parallelism;
  PipelinePlan plan;
  try {
    plan.schedule = pp::make_schedule(p.pipeline_parallel_schedule, int(p.pipeline_parallel_degree),
                                      int(c.training.local_batch_size / p.pipeline_parallel_microbatch_size));
    plan.stages = pp::split_stages(int(n_layers), plan.schedule.stages(), int(p.pipeline_parallel_first_stage_less_layers),
                                   int(p.pipeline_parallel_last_stage_less_layers));
  } catch (const Error& e) {
    TITAN_FAIL(source + ": " + e.message(), e.hint());
  }
  // Checked here, on every rank alike (the model's own check fires only on the last stage's rank).
  TITAN_CHECK(c.model.mtp_layers == 0 || plan.schedule.placement == pp::Placement::v,
              source + ": model.mtp_layers = " + std::to_string(c.model.mtp_layers) +
                  " with parallelism.pipeline_parallel_schedule = \"" + plan.schedule.name +
                  "\": the MTP modules on the last stage share the first stage's embedding, which this schedule "
                  "places on another rank",
              "use a V-shaped schedule, \"DualPipeV\" or \"ZBVZeroBubble\" (the first and last stages on one rank), "
              "or set model.mtp_layers = 0");
  plan.my_stages = plan.schedule.stages_of(pp_rank);
  for (int st : plan.my_stages) plan.mine.push_back(plan.stages[size_t(st)]);
  return plan;
}

std::vector<int> stages_using(const PipelinePlan& plan, const std::string& name, bool mtp) {
  std::vector<int> out, head;
  for (int st : plan.my_stages) {
    const pp::StageLayers& s = plan.stages[size_t(st)];
    if (s.head) head.push_back(st);
    if (name.starts_with("layers.")) {
      const int layer = std::stoi(name.substr(7));
      if (layer >= s.begin && layer < s.end) out.push_back(st);
    } else if (models::is_embedding_parameter(name) && s.embedding) {
      out.push_back(st);
    }
  }
  if (name.starts_with("layers.")) return out;
  if (!models::is_embedding_parameter(name)) return head;  // the final norm, the output head, MTP
  if (mtp) out.insert(out.end(), head.begin(), head.end());  // MTP embeds on the last stage
  return out;
}

std::set<std::string> names_on_other_stages(models::CausalLM& model, const distributed::ProcessGroup& pp) {
  std::set<std::string> mine;
  for (const auto& [name, p] : model.named_parameters()) mine.insert(name);
  for (const auto& [name, b] : model.named_buffers()) mine.insert(name);
  std::string listed;
  for (const std::string& name : mine) listed += name + "\n";
  std::set<std::string> others;
  for (const std::string& theirs : pp.all_gather(listed))
    for (size_t at = 0, nl; (nl = theirs.find('\n', at)) != std::string::npos; at = nl + 1)
      if (std::string name = theirs.substr(at, nl - at); !mine.count(name)) others.insert(std::move(name));
  return others;
}

// The tree sum (parallelism.pipeline_parallel_gradient_sum = "tree").
// Each micro-batch's parameter gradients, kept apart while its backward actions run between other
// micro-batches' and summed over the step as a binary tree in micro-batch order (tree_sum.h), as
// one rank accumulating micro-batches of the same shape does (data_parallel.h's SingleRank): the
// pipeline then computes the same gradients, bit for bit, as that run. Before a backward action
// of (stage, micro-batch), each parameter the stage uses gets that micro-batch's gradient so far
// (none at first), and after it the gradient is set aside again; once every stage using the
// parameter has finished the micro-batch (B, or I then W), it joins the sum. A parameter two
// stages use (the embedding, which the last stage's MTP modules read too) thus accumulates a
// micro-batch's contributions in the order one backward would. The one difference left: a
// parameter that both a linear layer (W) and another op (I) read gets its parts in another order.
// Under FSDP's per-micro-batch ZeRO-3 (fsdp.h) the same separation gives each unit exactly one
// micro-batch's gradient when FSDP reduce-scatters it; a completed micro-batch's gradient of a
// root-unit parameter goes to FSDP instead of the sum.
class PipelineStep::MicrobatchGradients {
 public:
  MicrobatchGradients(models::CausalLM& model, const PipelinePlan& plan, distributed::Fsdp* fsdp) : fsdp_(fsdp) {
    const auto params = model.named_parameters();
    bool mtp = false;
    for (const auto& [name, p] : params) mtp = mtp || name.starts_with("mtp.");
    for (const auto& [name, p] : params) {
      Param q;
      q.name = name;
      q.slot = p->var.slot();
      q.stages = stages_using(plan, name, mtp);
      TITAN_CHECK(!q.stages.empty(), "pipeline: parameter " + name + " belongs to none of this rank's stages");
      const size_t index = params_.size();
      params_.push_back(std::move(q));
      for (int st : params_.back().stages) by_stage_[st].push_back(index);
    }
  }

  void before(const pp::Action& a) {
    for (size_t i : by_stage_[a.stage]) {
      Param& q = params_[i];
      if (!q.slot->requires_grad) continue;
      const auto it = q.aside.find(a.microbatch);
      q.slot->grad = it == q.aside.end() ? Tensor() : it->second;
      q.slot->stale = false;
      if (it != q.aside.end()) q.aside.erase(it);  // after() sets it aside again if it is still held
    }
  }

  void after(const pp::Action& a) {
    const bool finished = a.op != pp::Op::backward_input;  // B, or W after its I
    if (finished) done_[{a.stage, a.microbatch}] = true;
    for (size_t i : by_stage_[a.stage]) {
      Param& q = params_[i];
      if (!q.slot->requires_grad) continue;
      if (q.slot->grad.defined()) q.aside[a.microbatch] = q.slot->grad;
      q.slot->grad = Tensor();
      if (!finished) continue;
      bool complete = true;
      for (int st : q.stages) complete = complete && done_.count({st, a.microbatch});
      if (!complete) continue;
      TITAN_CHECK(a.microbatch == q.next, "pipeline: micro-batch " + std::to_string(a.microbatch) +
                                              " finished before micro-batch " + std::to_string(q.next));
      ++q.next;
      const auto it = q.aside.find(a.microbatch);
      const Tensor g = it == q.aside.end() ? Tensor() : it->second;
      if (it != q.aside.end()) q.aside.erase(it);
      // FSDP reduces a root parameter's micro-batch now; a unit's it has reduced already.
      if (fsdp_ && fsdp_->reduce_microbatch_gradient(q.name, g)) continue;
      TITAN_CHECK(!fsdp_ || !g.defined(), "pipeline: FSDP left micro-batch " + std::to_string(a.microbatch) +
                                              "'s gradient of " + q.name + " unreduced");
      if (g.defined()) q.sum.add(g);
    }
  }

  void begin_run() {
    done_.clear();
    for (Param& q : params_) {
      q.next = 0;
      if (!in_step_) q.had_gradient = q.slot->grad.defined();  // zero_grad keeps the buffer, stale
    }
    in_step_ = true;
  }

  // The step's sums into the gradients. A parameter no gradient reached ends as one rank leaves
  // it: a zero gradient if it had a (stale) buffer, else none.
  void finish() {
    for (Param& q : params_) {
      TITAN_CHECK(q.aside.empty(), "pipeline: a micro-batch's gradient was never summed");
      if (!q.sum.empty()) {
        q.slot->grad = q.sum.take().view(q.slot->shape);
      } else if (q.had_gradient && q.slot->requires_grad) {
        q.slot->grad = Tensor::zeros(q.slot->shape, DType::f32, MemCategory::gradients);
      }
      q.slot->stale = false;
    }
    in_step_ = false;
  }

 private:
  struct Param {
    std::string name;
    std::shared_ptr<autograd::GradSlot> slot;
    std::vector<int> stages;          // this rank's stages that use it
    std::map<int, Tensor> aside;      // micro-batch -> its gradient so far
    int next = 0;                     // the micro-batch to sum next
    bool had_gradient = false;        // a gradient buffer when the step began
    distributed::TreeSum sum;
  };
  std::vector<Param> params_;
  std::map<int, std::vector<size_t>> by_stage_;
  std::map<std::pair<int, int>, bool> done_;  // (stage, micro-batch) whose backward finished
  bool in_step_ = false;                      // between the step's first run and finish()
  distributed::Fsdp* fsdp_;                   // FSDP reducing per micro-batch (null: none)
};

PipelineStep::~PipelineStep() = default;

PipelineStep::PipelineStep(PipelinePlan plan, models::CausalLM& model, const distributed::ProcessGroup& pp,
                           int64_t microbatch_size, int64_t seq_len, DType compute_dtype, bool overlap_pairs,
                           bool tree_sum, distributed::Fsdp* fsdp)
    : plan_(std::move(plan)),
      model_(model),
      pp_(pp),
      microbatch_size_(microbatch_size),
      executor_(plan_.schedule, pp, model.stage_activation_shape(microbatch_size, seq_len), compute_dtype,
                overlap_pairs) {
  fsdp_ = fsdp && fsdp->reduces_per_microbatch() ? fsdp : nullptr;
  if (tree_sum || fsdp_) gradients_ = std::make_unique<MicrobatchGradients>(model_, plan_, fsdp_);
}

void PipelineStep::finish_step() {
  if (gradients_) gradients_->finish();
}

PipelineLosses PipelineStep::run(const Tensor& inputs, const Tensor& targets, double loss_scale) {
  const int m = microbatches();
  const int64_t rows = microbatch_size_, seq = inputs.size(1);
  const std::vector<std::string> names = model_.loss_term_names();
  // [cross-entropy sum, then per term its sum and count], summed over the micro-batches here and
  // over the pipeline ranks below.
  std::vector<double> sums(1 + 2 * names.size(), 0.0);
  const auto forward = [&](int stage, int mb, const autograd::Variable& input) {
    const Tensor tokens = inputs.slice(0, mb * rows, (mb + 1) * rows);
    const Tensor tgt = targets.slice(0, mb * rows * seq, (mb + 1) * rows * seq);
    if (fsdp_) distributed::Fsdp::set_microbatch(mb);
    models::StageOutput o = model_.stage_forward(plan_.stages[size_t(stage)], input, tokens, tgt);
    sums[0] += o.cross_entropy;
    for (size_t k = 0; k < o.term_sums.size(); ++k) {
      size_t j = 0;
      while (j < names.size() && names[j] != o.term_sums[k].first) ++j;
      TITAN_CHECK(j < names.size(), "pipeline: stage " + std::to_string(stage) + " reported the loss term '" +
                                        o.term_sums[k].first + "', which the model does not list");
      sums[1 + 2 * j] += o.term_sums[k].second;
      sums[2 + 2 * j] += o.term_counts[k];
    }
    return pp::StageForward{o.hidden, o.loss};
  };
  pp::BackwardHooks hooks;
  if (gradients_) {
    gradients_->begin_run();
    hooks = {[this](const pp::Action& a) { gradients_->before(a); }, [this](const pp::Action& a) { gradients_->after(a); }};
  }
  executor_.run_step(forward, float(loss_scale / m), hooks);
  if (pp_.size() > 1) pp_.all_reduce(std::span<double>(sums));
  PipelineLosses out;
  out.cross_entropy = sums[0] / m;
  for (size_t j = 0; j < names.size(); ++j) {
    const double count = sums[2 + 2 * j];
    out.terms[names[j]] = count > 0 ? sums[1 + 2 * j] / count : sums[1 + 2 * j] / m;
  }
  return out;
}

double PipelineStep::evaluate(const Tensor& inputs, const Tensor& targets) {
  autograd::NoGradGuard no_grad;
  const pp::Schedule& s = plan_.schedule;
  const int me = pp_.rank(), last = s.stages() - 1;
  const DType dtype = model_.activation_dtype();
  const Shape shape = model_.stage_activation_shape(inputs.size(0), inputs.size(1));
  autograd::Variable h;
  double loss = 0;
  for (int st = 0; st <= last; ++st) {
    if (s.rank_of(st) != me) continue;
    if (st > 0 && s.rank_of(st - 1) != me) {  // the activation from the previous stage's rank
      Tensor in = Tensor::empty(shape, dtype, MemCategory::activations);
      pp_.recv(in, s.rank_of(st - 1), st - 1).wait();
      h = autograd::Variable(in);
    }
    const models::StageOutput o = model_.stage_forward(plan_.stages[size_t(st)], h, inputs, targets);
    if (st == last) {
      loss = o.cross_entropy;
    } else {
      h = o.hidden;
      if (s.rank_of(st + 1) != me) pp_.send(h.value().contiguous(), s.rank_of(st + 1), st).wait();
    }
  }
  std::vector<double> total = {loss};
  pp_.all_reduce(std::span<double>(total));  // only the last stage's rank contributes
  return total[0];
}

}  // namespace titan::train
