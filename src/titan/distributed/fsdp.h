// FSDP (ZeRO-3, FSDP2's semantics) and HSDP over a shard group, and a replicate group for HSDP.
//
// Layout: every parameter of shape [d0, ...] is split on dim 0 into N = shard-group-size chunks
// of ceil(d0 / N) rows (an expert-parallel rank's routed experts: N = the expert-FSDP group's size); rank r holds rows [r * rows, r * rows + rows) of it, zero-padded past d0
// (trailing ranks may hold only padding). That shard (f32) is the master the optimizer steps;
// under mixed precision a bf16 copy of it is what GEMM weights gather.
//
// Per unit (the model's sharding_units(): the embedding, each block, the output head; the rest
// is the root unit):
//   forward   before the unit: wait for its all-gather (issued earlier as a prefetch), issue the
//             next unit's; after it: free the gathered parameters unless reshard_after_forward
//             keeps them (per_unit: all but the output head; always: all; never: none).
//   backward  before the unit's backward: gather it again if freed, prefetch the unit before it;
//             after: reduce-scatter its f32 gradients into the shards (per micro-batch, added to
//             the shard's gradient), free the gathered parameters. HSDP then all-reduces each
//             shard's gradient over the replicas. The previous unit's reduce-scatters finish
//             first: at most two units' unsharded gradients are ever held.
// Under pipeline parallelism (FsdpOptions::pipeline) see FsdpOptions::pipeline_per_step.
// The root unit is gathered by begin_forward and reduced by finish_backward. Gradients are sums
// (the loss is normalized by the global token count), reduced as a binary tree over ranks and
// then over micro-batches (tree_sum.h): FSDP over 2^k ranks gives the same gradients, bit for
// bit, as one rank accumulating the same micro-batches.
#pragma once

#include <functional>
#include <map>

#include "titan/autograd/quantized_linear.h"
#include "titan/distributed/data_parallel.h"
#include "titan/distributed/fsdp_reshard.h"
#include "titan/distributed/tree_sum.h"

namespace titan::distributed {

struct FsdpOptions {
  ReshardAfterForward reshard_after_forward = ReshardAfterForward::per_unit;
  // GEMM weights gathered and computed in this type (bf16 or f16 under mixed precision; the f32
  // shard stays the master).
  DType param_dtype = DType::f32;
  // Gradients reduce-scattered (and all-reduced over HSDP's replicas) in this type, summed in f32
  // inside the reduction, then read back into the f32 shard gradients.
  DType gradient_sync_dtype = DType::f32;
  uint64_t seed = 0;         // the shards' initial values: exactly those of the whole parameters' init
  // Under pipeline parallelism a unit's micro-batches run forward and backward between other
  // stages' work, and a zero-bubble schedule computes weight gradients (W) after the unit's
  // backward hook. Two ways ([parallelism] pipeline_parallel_fsdp):
  //   zero3     (pipeline_per_step false) ZeRO-3 per micro-batch: a unit's gradients of a
  //             micro-batch are reduce-scattered once its last weight gradient is computed (the
  //             end of its backward, or under a split backward a marker queued behind its weight
  //             GEMMs that W runs), and folded into the shard's sum over micro-batches (a tree,
  //             or in place with sum_in_place); its parameters are gathered for each forward and
  //             backward and freed after them as without PP (reshard_after_forward as usual; after
  //             a backward also when no other micro-batch's backward of the unit is pending).
  //             The pipeline must say which micro-batch each forward is for (set_microbatch) and
  //             hand over the root unit's gradients per micro-batch (reduce_microbatch_gradient).
  //   per_step  gradients stay unsharded over the step (summed over the micro-batches as
  //             train/pipeline_step.h says) and are reduce-scattered once, by finish_backward, after
  //             the last W; parameters stay gathered from their first use to the step's end
  //             (TorchTitan's default under PP), unless reshard_after_forward = always frees them
  //             after every forward and backward of a unit. Fewer bytes, far more memory.
  bool pipeline = false;
  bool pipeline_per_step = false;
  bool sum_in_place = false;  // zero3: a shard's micro-batches added in order (to rounding), not as a tree
  // FP8 all-gather ([quantize.linear.float8] enable_fsdp_float8_all_gather): these parameters (by
  // name: FP8 blockwise Linear weights, [M, K]) travel as E4M3 codes, 1 byte a value. Each rank
  // takes its rows' per-128 x 128-block amax (blocks by the whole weight's rows: a shard may cut
  // one), the ranks all-gather those small grids and take their max, so every rank has the whole
  // weight's block scales; each encodes its own rows with them and the codes are all-gathered
  // into the weight's QuantizedWeight (adopt_fp8_blockwise), which then holds exactly what
  // quantizing the gathered weight on one rank gives (the bf16-rounded values under mixed
  // precision, as the 1-rank path quantizes its bf16 copy). Empty: every weight gathers in
  // param_dtype.
  std::map<std::string, autograd::QuantizedWeight*> fp8_all_gather;
  // zero3: the pipeline stage a parameter's unit runs in (by its name): a unit prefetches the next
  // (or, in backward, the previous) unit only within its stage. Null: one stage.
  std::function<int(const std::string&)> stage_of;
};

class Fsdp : public DataParallel, public nn::UnitHooks {
 public:
  // Shards every parameter of `model` (replacing its storage: the unsharded values exist only
  // while a unit is gathered) and initializes the shards from their Init and the seed.
  // replicate: HSDP's replica group (null or one rank: plain FSDP). expert_shard: the group that
  // shards parameters marked expert_sharded (expert parallelism's efsdp; null: `shard`).
  Fsdp(nn::Module& model, const std::vector<nn::ShardingUnit>& units, const ProcessGroup& shard,
       const ProcessGroup* replicate, const FsdpOptions& options, const ProcessGroup* expert_shard = nullptr);
  ~Fsdp() override;

  const std::vector<nn::TrainableParam>& params() const override { return trainables_; }
  double sum_over_shards(double local) const override;
  bool writes_params() const override;
  void zero_grad() override;
  void begin_forward(bool sync_gradients) override;
  void finish_backward() override;
  void finish_forward() override;
  void refresh_compute_copies() override;
  std::string describe() const override;

  // zero3 under PP: the micro-batch the forwards this thread runs next belong to.
  static void set_microbatch(int microbatch);
  // zero3 under PP: micro-batch's whole gradient of parameter `name` (undefined: none reached it),
  // once every stage using it has finished that micro-batch's backward. The root unit's are
  // reduce-scattered now and true returned; a unit's parameter (reduced by the unit's hooks) false.
  bool reduce_microbatch_gradient(const std::string& name, const Tensor& grad);
  bool reduces_per_microbatch() const { return options_.pipeline && !options_.pipeline_per_step; }

  void before_forward(const nn::Module& unit) override;
  void after_forward(const nn::Module& unit) override;

  // Bytes of unsharded parameters gathered now, and the most at any moment since the last reset
  // (tests hold it to "no more than the units in flight").
  int64_t gathered_bytes() const;
  int64_t peak_gathered_bytes() const { return peak_gathered_; }
  void reset_peak_gathered() { peak_gathered_ = gathered_bytes(); }

 private:
  struct Param;
  struct Unit;
  struct Reduction;
  Unit& unit_of(const nn::Module& m);
  bool reshards_after_forward(const Unit& u) const;  // frees the unit's gathered parameters after its forward
  void gather(Unit& u);        // issues the unit's all-gathers unless gathered or in flight
  void setup_fp8_gather(Param& q, autograd::QuantizedWeight* cache, int n);  // FsdpOptions::fp8_all_gather
  void send_fp8_amax(Param& q);   // this shard's block amax to the group
  Work send_fp8_codes(Param& q);  // once every shard's amax is in: the scales, this shard's codes, their all-gather
  void wait_gathered(Unit& u);
  void release(Unit& u);
  void pre_backward(Unit& u);
  void post_backward(Unit& u);
  void post_backward_microbatch(Unit& u, int microbatch);  // zero3 under PP
  void unit_microbatch_done(Unit& u, int microbatch);      // ... after its last weight gradient
  Unit* prefetch_target(const Unit& u, int step) const;    // the unit `step` away, if it may be prefetched
  void reduce_gradients(Unit& u);
  void reduce_param(Param& q);
  // A reduce-scatter's input when it must be cast (gradient_sync_dtype) or padded: a kept buffer,
  // reused once the reduction that last sent it is done.
  struct SendBuffer {
    Tensor data;
    Work busy;
  };
  SendBuffer& send_buffer(int64_t numel, DType dtype);
  void fold(size_t trainable, const Tensor& g);
  void advance_reductions(bool wait);  // HSDP all-reduces in order; with wait, every reduction folded

  const ProcessGroup& shard_;
  const ProcessGroup* expert_shard_;
  const ProcessGroup* replicate_;
  FsdpOptions options_;
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::unique_ptr<Unit>> units_;  // forward order; the root unit last
  std::map<const nn::Module*, Unit*> by_module_;
  std::map<std::string, Param*> by_name_;
  std::vector<nn::TrainableParam> trainables_;
  std::vector<std::unique_ptr<Reduction>> reductions_;  // this micro-batch's, in issue order
  std::vector<std::unique_ptr<SendBuffer>> send_buffers_;
  std::vector<TreeSum> sums_;                           // per trainable: the step's shard gradients
  bool in_step_ = false;                                // between zero_grad and finish_backward
  int64_t peak_gathered_ = 0;
  int micro_batches_ = 0;
};

}  // namespace titan::distributed
