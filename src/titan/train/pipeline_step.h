// Pipeline parallelism in the trainer (parallelism.pipeline_parallel_degree > 1): the stage split,
// one step's micro-batches through the schedule, and validation through the stages.
//
// Each pipeline rank builds only its stages' parts of the model (ModelOptions::pipeline_stages);
// every rank of a pipeline loads the same batch, which the first stage embeds and the last scores.
// A step splits the local batch into micro-batches of pipeline_parallel_microbatch_size sequences
// and runs this rank's actions (distributed/pipeline_executor.h); the losses, known on the stages
// that compute them, are then summed over the pipeline group so that every rank logs the same.
//
// The micro-batches' gradients are summed one of two ways (parallelism.pipeline_parallel_gradient_sum):
//   in_place  each backward action adds into the parameters' gradients as autograd does, so a step
//             holds one gradient per parameter (TorchTitan's); the order of the additions is the
//             schedule's, so the result matches one rank's to rounding;
//   tree      each micro-batch's gradients are kept apart and summed as one rank accumulating
//             micro-batches does (MicrobatchGradients in pipeline_step.cpp): the same bits as one
//             rank, holding up to log2(micro-batches) + 1 gradients per parameter.
// Under FSDP's zero3 (distributed/fsdp.h) the micro-batches' gradients are kept apart either way
// (as the tree sum does) and FSDP reduce-scatters each micro-batch's into the shards, which sum
// them in place or as the tree; each micro-batch is then loaded interleaved over the
// data-parallel ranks (interleaves_data) so that the tree over ranks and micro-batches is one rank's.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "titan/distributed/device_mesh.h"
#include "titan/distributed/pipeline_executor.h"
#include "titan/distributed/pipeline_stages.h"
#include "titan/models/causal_lm.h"
#include "titan/train/config.h"

namespace titan::distributed {
class Fsdp;
}

namespace titan::train {

// The schedule and stage split a config asks for, before the model exists.
struct PipelinePlan {
  distributed::pp::Schedule schedule;
  std::vector<distributed::pp::StageLayers> stages;  // every stage, by global index
  std::vector<distributed::pp::StageLayers> mine;    // this rank's, in local order
  std::vector<int> my_stages;                        // their global indices
};
// Throws, naming `source` and the key to change, for a schedule or split that cannot work.
PipelinePlan plan_pipeline(const JobConfig& c, int64_t n_layers, int pp_rank, const std::string& source);

// This rank's stages (global indices) whose forward uses parameter `name`; mtp: the model has MTP
// modules (on the last stage, reading the embedding).
std::vector<int> stages_using(const PipelinePlan& plan, const std::string& name, bool mtp);

// The parameter and buffer names the other ranks of the pipeline group hold and this one does
// not (collective over pp): what a checkpoint has beyond this rank's stages.
std::set<std::string> names_on_other_stages(models::CausalLM& model, const distributed::ProcessGroup& pp);

// A step's losses as training_loss reports them, the means over its micro-batches.
struct PipelineLosses {
  double cross_entropy = 0;
  std::map<std::string, double> terms;
};

class PipelineStep {
 public:
  // overlap_pairs: run the schedule's overlapped pairs as compute pairs (pipeline_executor.h);
  // tree_sum: sum the micro-batches' gradients as one rank does (above); fsdp: the model's FSDP,
  // which, when it reduces per micro-batch (fsdp.h's zero3), is told each forward's micro-batch
  // and gets each micro-batch's gradients apart.
  PipelineStep(PipelinePlan plan, models::CausalLM& model, const distributed::ProcessGroup& pp, int64_t microbatch_size,
               int64_t seq_len, DType compute_dtype, bool overlap_pairs = false, bool tree_sum = false,
               distributed::Fsdp* fsdp = nullptr);
  ~PipelineStep();
  // Every micro-batch of inputs [B, S] / targets [B*S] through this rank's actions; each loss's
  // gradient is seeded with loss_scale / micro-batches (so loss_scale is what one micro-batch of
  // the whole batch would be seeded with). Gradients accumulate into the parameters.
  PipelineLosses run(const Tensor& inputs, const Tensor& targets, double loss_scale);
  // After the step's last run(): under the tree sum, the parameters' gradients become their sums
  // over the step's micro-batches (in place, they already are).
  void finish_step();
  // The mean next-token cross-entropy of a batch, forward only, through the stages in order (every
  // pipeline rank returns it).
  double evaluate(const Tensor& inputs, const Tensor& targets);
  int microbatches() const { return plan_.schedule.microbatches; }
  int64_t microbatch_size() const { return microbatch_size_; }
  // Whether each micro-batch is loaded apart, interleaved over the data-parallel ranks (the
  // trainer's train_step): under FSDP reducing per micro-batch.
  bool interleaves_data() const { return fsdp_ != nullptr; }
  const distributed::pp::PipelineExecutor& executor() const { return executor_; }

 private:
  class MicrobatchGradients;
  PipelinePlan plan_;
  models::CausalLM& model_;
  std::unique_ptr<MicrobatchGradients> gradients_;  // under the tree sum or FSDP per micro-batch
  distributed::Fsdp* fsdp_ = nullptr;               // FSDP reducing per micro-batch
  const distributed::ProcessGroup& pp_;
  int64_t microbatch_size_;
  distributed::pp::PipelineExecutor executor_;
};

}  // namespace titan::train
