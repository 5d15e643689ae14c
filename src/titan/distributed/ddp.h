// DDP: parameters replicated on every rank of a group; gradients summed over it by all-reduces
// of buckets as backward produces them, each overlapping the rest of backward.
//
// Buckets: the model's units in backward order (the output head first, then the blocks, then
// the embedding), merged while a bucket stays under bucket_bytes (25 MiB, PyTorch's default);
// the root unit's parameters (final norm, MTP) form the last bucket. Each parameter's gradient
// is a view into its bucket's flat buffer, so backward writes straight into what is sent. A
// bucket is all-reduced when the backward of its last unit ends, on the micro-batch that ends
// the step (earlier micro-batches only accumulate: PyTorch's no_sync).
//
// Under pipeline parallelism (`pipeline`) a unit's micro-batches run backward between other
// micro-batches' and the gradients are summed outside the buckets (train/pipeline_step.cpp), so
// every bucket waits for finish_backward, which copies the step's gradients in and reduces them.
#pragma once

#include <map>

#include "titan/distributed/data_parallel.h"

namespace titan::distributed {

class Ddp : public DataParallel, public nn::UnitHooks {
 public:
  Ddp(nn::Module& model, const std::vector<nn::ShardingUnit>& units, const ProcessGroup& group,
      int64_t bucket_bytes = 25 << 20, bool pipeline = false, DType gradient_sync_dtype = DType::f32);
  ~Ddp() override;

  const std::vector<nn::TrainableParam>& params() const override { return trainables_; }
  double sum_over_shards(double local) const override { return local; }
  bool writes_params() const override { return group_.rank() == 0; }
  void zero_grad() override;
  void begin_forward(bool sync_gradients) override { sync_ = sync_gradients; }
  void finish_backward() override;
  void finish_forward() override;
  void refresh_compute_copies() override { model_.refresh_compute_copies(); }
  std::string describe() const override;

  void before_forward(const nn::Module& unit) override;
  void after_forward(const nn::Module&) override {}

 private:
  struct Bucket {
    Tensor flat;                          // f32 gradients of its parameters, back to back
    Tensor wire;                          // flat cast to gradient_sync_dtype (not f32): what is all-reduced
    std::vector<nn::Parameter*> params;
    std::vector<int64_t> offsets;
    Work reduce;
    bool reduced = false;  // this step
  };
  struct Unit {
    std::string name;
    int uses = 0;
    std::vector<size_t> buckets;  // reduced when this unit's backward ends
  };
  void post_backward(Unit& u);
  void reduce(Bucket& b);
  void attach(Bucket& b);

  nn::Module& model_;
  const ProcessGroup& group_;
  std::vector<nn::TrainableParam> trainables_;
  std::vector<Bucket> buckets_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::map<const nn::Module*, Unit*> by_module_;
  std::vector<nn::Module*> hooked_;
  bool sync_ = true;
  bool pipeline_ = false;
  DType sync_dtype_ = DType::f32;  // training.gradient_sync_dtype
};

}  // namespace titan::distributed
