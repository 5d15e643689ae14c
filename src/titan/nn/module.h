// Module: a tree of named parameters, buffers and child modules, like torch.nn.Module. Names are
// dotted paths ("layers.3.attention.wq.weight"); a model's state_dict uses the same names as its
// Hugging Face adapter maps, and parameter initialization is keyed by them (counter-based RNG),
// so a parameter gets the same values however it is later sharded.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/autograd/variable.h"
#include "titan/core/shape.h"

namespace titan::nn {

using autograd::Variable;

// How a parameter is initialized (applied by Module::init_parameters with the run's seed).
struct Init {
  enum class Kind { zeros, ones, constant, normal, trunc_normal, uniform } kind = Kind::zeros;
  double a = 0, b = 0;        // normal/trunc_normal: mean, std; uniform: low, high; constant: value
  double low = -2, high = 2;  // trunc_normal bounds, in units of std around the mean
  static Init zeros() { return {Kind::zeros}; }
  static Init ones() { return {Kind::ones}; }
  static Init constant(double v) { return {Kind::constant, v}; }
  static Init normal(double mean, double std) { return {Kind::normal, mean, std}; }
  static Init trunc_normal(double std, double bound = 2) { return {Kind::trunc_normal, 0, std, -bound, bound}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
};

struct Parameter {
  Variable var;               // the f32 master value and its f32 gradient
  Init init;
  bool weight_decay = true;   // no-decay group: norms' weights, biases (set by the module)
  bool gemm_weight = false;   // read by a GEMM: gets a compute copy under mixed precision
  // One of an MoE layer's routed experts' weights ([E, ...]): what expert parallelism divides.
  bool routed_expert = false;
  // Indexed by the vocabulary (the token embedding, the output head): AdamW's under Muon
  // (optim/param_groups.h), 2-D though it is. Set by nn::Embedding and by each model on its head.
  bool vocabulary = false;
  // Added to activations rather than multiplying them, 2-D though it is (DeepSeek-V4's compressor
  // position bias, a static bias per the paper's split): AdamW's under Muon, as every bias.
  bool bias_table = false;
  // Tensor parallelism as the model's plan declares it, at any degree (one rank included): the
  // dimension it divides (-1: whole on every TP rank) and, for a whole one, whether each rank's
  // gradient is a partial sum. The memory planner reads it from a model built without storage.
  struct TensorParallelPlan {
    int dim = -1;
    bool partial_grad = false;
  } tp_plan;
  Tensor compute;             // bf16 copy of the master the GEMMs read (mixed precision), else undefined
  // Where this rank's tensor sits in the global parameter (an empty global_shape: it is the whole
  // parameter): a tensor-parallel shard (distributed/tensor_parallel.h) or a rank's routed experts
  // (distributed/expert_parallel.h). Set by a model's plan.
  GlobalSlice slice;
  // Tensor parallelism, for a parameter every TP rank holds whole: whether each rank's gradient
  // is a partial sum (a sequence-parallel norm sees 1/tp of the tokens: the gradients are summed
  // over TP after backward) and whether this rank is not the first to hold it (checkpoints and the
  // gradient norm then leave it to the first).
  bool tp_partial_grad = false;
  bool tp_duplicate = false;
  // Expert parallelism: this rank's routed experts, which FSDP shards over the expert-FSDP group
  // (the ranks holding the same experts) instead of the data-parallel shard group.
  bool expert_sharded = false;
};

// Divides a parameter along `dim` into `parts` equal pieces and keeps piece `index`: its variable
// takes the piece's shape (no memory while it has none; zeros where it had some) and its slice
// says where the piece sits (composing with a slice it already had). A parallel plan (tensor or
// expert parallel) places a parameter so, once, right after the model declared it whole: the
// plan is where each rank's local shape comes from.
void divide_parameter(Parameter& p, int dim, int64_t parts, int64_t index);

class Module;

// What a buffer is to a checkpoint. state: saved, and a checkpoint must hold it. The others are
// routing statistics a checkpoint may lack (one from Hugging Face: zeros then): step_statistic
// is this rank's count since the step began (zero at every save, never loaded, dropped with a
// discarded step); saved_statistic is loaded like state when the checkpoint has it.
enum class BufferKind { state, step_statistic, saved_statistic };

// While one lives (on this thread), register_parameter gives each parameter its shape and no
// memory (PyTorch's meta device): a model built so shows the memory planner its parameters and
// their declared plans without holding them, and cannot run until materialize_parameters(). A
// family builds its model so, places it, then materializes each rank's pieces only.
class ParametersWithoutStorage {
 public:
  ParametersWithoutStorage();
  ~ParametersWithoutStorage();
  ParametersWithoutStorage(const ParametersWithoutStorage&) = delete;
  ParametersWithoutStorage& operator=(const ParametersWithoutStorage&) = delete;

 private:
  bool outer_;
};

// A parallel wrapper's hooks on one unit of a model's plan (an FSDP unit: the embedding, a block,
// the output head): before_forward gathers the unit's parameters, after_forward may release them.
// The model brackets each unit's forward with a UnitScope; a module without hooks costs a branch.
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_forward(const Module& unit) = 0;
  virtual void after_forward(const Module& unit) = 0;
};

// The tensors an optimizer step updates for one parameter: the whole parameter, or this rank's
// shard of it (FSDP). var holds the f32 master value and its gradient (undefined when the
// parameter got none this step); compute, when not null, receives bf16(value) with each update
// (mixed precision). slice says where value sits in the global parameter (empty: all of it).
// tp_partial_grad / tp_duplicate: the Parameter's (tensor parallelism); tp_dim: the dimension its
// tensor-parallel plan divides (-1: none; Muon gathers such a matrix over the TP group).
struct TrainableParam {
  std::string name;
  Variable var;
  Tensor* compute = nullptr;
  bool weight_decay = true;
  GlobalSlice slice;
  bool tp_partial_grad = false;
  bool tp_duplicate = false;
  int tp_dim = -1;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // All parameters of this module and its children, depth-first in registration order, with
  // dotted names.
  std::vector<std::pair<std::string, Parameter*>> named_parameters();
  std::vector<std::pair<std::string, Tensor>> named_buffers();
  std::vector<std::pair<std::string, Tensor>> named_buffers(BufferKind kind);  // those of one kind
  int64_t num_parameters();

  // Parameters and buffers by name (views of the live tensors, not copies).
  std::vector<std::pair<std::string, Tensor>> state_dict();
  // Copies values in by name (converting dtype). strict: every parameter and buffer must be
  // present and nothing else. Errors name the tensor, the shapes and `source` (e.g. a file).
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true,
                       const std::string& source = "state dict");

  // Gives every parameter still without memory (declared under ParametersWithoutStorage, then
  // placed by its plan) its memory, zeroed; nothing while a ParametersWithoutStorage lives.
  void materialize_parameters();

  // Re-initializes every parameter from its Init with (seed, full name, element index of the
  // global parameter: a tensor-parallel shard gets the values of its slice).
  void init_parameters(uint64_t seed);
  void zero_grad();

  // Mixed precision: with bf16 (f16), every GEMM weight gets a bf16 (f16) compute copy of its f32
  // master (refreshed by refresh_compute_copies() or by the optimizer step); f32 drops them.
  void set_compute_dtype(DType dtype);
  void refresh_compute_copies();

  Module* child(const std::string& name) const;
  // fn on every module of the tree, children first, then this one (torch.nn.Module.apply): how
  // model converters (models/converters.h) reach the layers they swap.
  void apply(const std::function<void(Module&)>& fn);

  // The parallel wrapper's hooks on this module as a unit (null: none); see UnitScope.
  UnitHooks* unit_hooks() const { return unit_hooks_; }
  void set_unit_hooks(UnitHooks* hooks) { unit_hooks_ = hooks; }

 protected:
  Parameter& register_parameter(const std::string& name, const Shape& shape, Init init, bool weight_decay = true);
  void register_buffer(const std::string& name, Tensor t, BufferKind kind = BufferKind::state);
  template <class M>
  M& register_module(const std::string& name, std::unique_ptr<M> m) {
    M& ref = *m;
    add_child(name, std::move(m));
    return ref;
  }

 private:
  void add_child(const std::string& name, std::unique_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void collect_parameters(const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>& out);
  void collect_buffers(const std::string& prefix, const BufferKind* kind, std::vector<std::pair<std::string, Tensor>>& out);

  std::vector<std::pair<std::string, std::unique_ptr<Parameter>>> params_;
  struct Buffer {
    std::string name;
    Tensor tensor;
    BufferKind kind;
  };
  std::vector<Buffer> buffers_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  UnitHooks* unit_hooks_ = nullptr;
};

// One unit of a model's data-parallel plan (TorchTitan's fully_shard calls, declared in each
// model's parallelize.cpp): a module whose forward the model brackets with a UnitScope.
// Parameters under no unit form the root unit, gathered for the whole step.
struct ShardingUnit {
  std::string name;  // the module's path, the prefix of its parameters' names ("layers.3")
  Module* module;
  // Whether, by default, FSDP frees its gathered parameters after its forward (and gathers them
  // again for backward). The output head keeps them: its backward comes right after its forward.
  bool reshard_after_forward = true;
};

// Runs the unit's hooks around a scope: before_forward now, after_forward when the scope ends.
class UnitScope {
 public:
  explicit UnitScope(const Module& unit) : unit_(unit.unit_hooks() ? &unit : nullptr) {
    if (unit_) unit_->unit_hooks()->before_forward(*unit_);
  }
  ~UnitScope() {
    if (unit_) unit_->unit_hooks()->after_forward(*unit_);
  }
  UnitScope(const UnitScope&) = delete;
  UnitScope& operator=(const UnitScope&) = delete;

 private:
  const Module* unit_;
};

// Every parameter of `m` as a whole TrainableParam (one rank, or data parallel without sharding).
std::vector<TrainableParam> trainable_params(const std::vector<std::pair<std::string, Parameter*>>& params);

// Fills `out` with parameter `name`'s initial values (its Init, the run's seed): the whole
// parameter, or, with a slice, the part of it `out` holds (the same values, by the counter-based
// RNG, as the whole parameter's init puts there).
void init_parameter(Tensor& out, const std::string& name, const Init& init, uint64_t seed,
                    const GlobalSlice* slice = nullptr);

// A list of child modules named "0", "1", ... (torch.nn.ModuleList). A pipeline stage holds some
// of a model's blocks: append_as keeps each one's global index as its name ("layers.5" stays
// "layers.5"), and the list holds only those; index(i) tells item i's global index.
template <class M>
class ModuleList : public Module {
 public:
  M& append(std::unique_ptr<M> m) { return append_as(indices_.empty() ? 0 : indices_.back() + 1, std::move(m)); }
  M& append_as(size_t index, std::unique_ptr<M> m) {
    items_.push_back(&register_module(std::to_string(index), std::move(m)));
    indices_.push_back(index);
    return *items_.back();
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) { return *items_[i]; }
  size_t index(size_t i) const { return indices_[i]; }

 private:
  std::vector<M*> items_;
  std::vector<size_t> indices_;
};

}  // namespace titan::nn
