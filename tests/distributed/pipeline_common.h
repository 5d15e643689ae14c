// The pipeline tests' runs: a debug model's 20 steps over `pp` pipeline ranks (x `tp`), micro-batches
// of one sequence, and the same steps on rank 0 alone accumulating micro-batches of `local_batch`.
//
// Every pipeline schedule reproduces the 1-rank run to the last bit: each micro-batch computes the
// same numbers on either, and these runs use the tree sum, which keeps each micro-batch's gradients
// apart and sums them as one rank does (train/pipeline_step.cpp), the zero-bubble schedules'
// deferred weight gradients included. The default in-place sum adds them in the schedule's order,
// matching one rank to rounding: tests of it pass --parallelism.pipeline_parallel_gradient_sum=in_place.
#pragma once

#include "distributed/common.h"
#include "titan/distributed/pipeline_schedule.h"

namespace titan::test {

template <class Suite, int32_t vocab = 257>
class PipelineSuite : public TrainingSuite<Suite, vocab> {
 protected:
  using TrainingSuite<Suite, vocab>::data;
  using TrainingSuite<Suite, vocab>::root;
  // batch: the global batch (each of `shard` FSDP ranks takes its share); local_batch: the
  // reference's micro-batches (0: the whole batch at once).
  static train::JobConfig config(const std::string& model, const std::string& name, int64_t pp, int64_t tp,
                                 const std::string& schedule, int64_t batch, const std::vector<std::string>& extra = {},
                                 int64_t local_batch = 0, int64_t shard = 1) {
    std::string toml = base_toml(model, data(), root() / (model + "_" + name), 20);
    toml += "[parallelism]\ndata_parallel_shard_degree = " + std::to_string(shard) + "\npipeline_parallel_degree = " + std::to_string(pp) +
            "\ntensor_parallel_degree = " + std::to_string(tp) + "\npipeline_parallel_schedule = \"" + schedule +
            "\"\npipeline_parallel_microbatch_size = 1\npipeline_parallel_gradient_sum = \"tree\"\n";
    train::JobConfig cfg = train::parse_config(toml, name + ".toml", extra);
    cfg.training.local_batch_size = local_batch > 0 ? local_batch : batch / shard;
    cfg.training.global_batch_size = batch;
    return cfg;
  }
};

}  // namespace titan::test
