// How a model's parameters and gradients are laid out over the data-parallel ranks, and the
// communication that keeps them consistent. Three layouts share one interface the trainer drives:
//   SingleRank  one process: the model's own parameters, nothing to communicate;
//   Ddp         (ddp.h) parameters replicated, gradients all-reduced in buckets during backward;
//   Fsdp        (fsdp.h) parameters sharded on dim 0, gathered per unit for its forward and
//               backward, gradients reduce-scattered as each unit's backward ends; with a
//               replicate group, HSDP (the shard then all-reduced across replicas).
//
// Each optimizer step the trainer calls zero_grad(), then per micro-batch begin_forward(), the
// model's forward and backward, and after the last micro-batch's backward finish_backward(): the
// gradients of params() are then the sums over the data-parallel ranks. A forward without
// backward (validation) is begin_forward() ... finish_forward().
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "titan/distributed/process_group.h"
#include "titan/distributed/tree_sum.h"
#include "titan/nn/module.h"

namespace titan::distributed {

class DataParallel {
 public:
  virtual ~DataParallel() = default;
  // What the optimizer steps, clipping measures and checkpoints hold: whole parameters, or this
  // rank's shards.
  virtual const std::vector<nn::TrainableParam>& params() const = 0;
  // The sum of `local` over the ranks that split params() (for the global gradient norm).
  virtual double sum_over_shards(double local) const = 0;
  // Whether this rank writes params() into checkpoints (each piece of a parameter is written by
  // exactly one rank: replicas other than the first write nothing).
  virtual bool writes_params() const = 0;
  virtual void zero_grad() = 0;
  // sync_gradients: this micro-batch's backward ends the step (DDP reduces only then).
  virtual void begin_forward(bool sync_gradients) = 0;
  virtual void finish_backward() = 0;
  virtual void finish_forward() = 0;
  // After params()' values were written (a checkpoint loaded): refresh what derives from them
  // (the bf16 compute copies).
  virtual void refresh_compute_copies() = 0;
  // "FSDP over 4 ranks", for the log.
  virtual std::string describe() const = 0;
};

// One process: the model's parameters as they are. With several micro-batches per step, each
// micro-batch's backward writes fresh gradients, summed over the step as a binary tree
// (tree_sum.h): the sum data-parallel ranks form with their reduction, so a run on 2^k ranks
// reproduces the 1-rank run to the last bit (kernels that accumulate in place would instead fold
// the products' partial sums onto the previous micro-batch's, in another rounding order).
class SingleRank : public DataParallel {
 public:
  explicit SingleRank(nn::Module& model);
  const std::vector<nn::TrainableParam>& params() const override { return params_; }
  double sum_over_shards(double local) const override { return local; }
  bool writes_params() const override { return true; }
  void zero_grad() override;
  void begin_forward(bool sync_gradients) override;
  void finish_backward() override;
  void finish_forward() override {}
  void refresh_compute_copies() override { model_.refresh_compute_copies(); }
  std::string describe() const override { return "no data parallelism"; }

 private:
  void fold_micro_batch();  // adds the gradients of the micro-batch just done into sums_
  nn::Module& model_;
  std::vector<nn::TrainableParam> params_;
  std::vector<TreeSum> sums_;  // per parameter: the step's gradients so far
  int micro_batches_ = 0;     // started this step; -1 outside a step
};

}  // namespace titan::distributed
