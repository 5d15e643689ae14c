#include "titan/distributed/fsdp.h"

#include <algorithm>

#include <fmt/format.h>

#include "titan/core/error.h"
#include "titan/kernels/cast.h"
#include "titan/kernels/quantize.h"

namespace titan::distributed {

struct Fsdp::Param {
  std::string name;
  nn::Parameter* p = nullptr;
  const ProcessGroup* group = nullptr;  // the ranks it is sharded over
  Shape shape;                 // this rank's whole parameter (its slice under TP / EP)
  int64_t d0 = 0, rest = 0;    // rows, and elements per row
  int64_t rows = 0, valid = 0; // rows per rank; this rank's rows that are not padding
  bool bf16 = false;           // gathers the half-precision compute copy (a GEMM weight under mixed precision)
  Tensor shard;                // [rows, ...] f32, zero past `valid`: the master
  // [rows, ...] bf16 / f16 (bf16 only: the half-precision compute dtype), what the all-gather
  // sends: cast from the master when the unit is gathered and freed once the gather is done, so no
  // half-precision copy of the shard lives between uses.
  Tensor shard_compute;
  Tensor compute_valid;        // its first `valid` rows
  Tensor full;                 // [N * rows, ...]: the gathered parameter (released while sharded)
  size_t trainable = 0;        // index in trainables_
  // FP8 all-gather (FsdpOptions::fp8_all_gather): `full` holds E4M3 codes; these buffers are kept.
  autograd::QuantizedWeight* fp8 = nullptr;  // the Linear's forms, which adopt the gathered codes
  Tensor fp8_values;   // [rows, K] f32: what is quantized (the master, or its bf16 rounding), zero past `valid`
  Tensor amax_mine;    // [blocks of the whole weight] f32: this shard's rows' amax per block
  Tensor amax_all;     // [N, blocks]: every shard's, gathered
  Tensor fp8_scales;   // [ceil(d0 / 128), ceil(K / 128)] f32: the whole weight's block scales
  Tensor codes_mine;   // [rows, K] f8e4m3: this shard's rows, what the all-gather sends
  Work amax_gather;
};

struct Fsdp::Unit {
  std::string name;
  const nn::Module* module = nullptr;  // null for the root unit
  std::vector<Param*> params;
  bool reshard_after_forward = true;
  size_t index = 0;                    // in forward order
  bool gathered = false;
  std::vector<Work> gathers;           // in flight
  int uses = 0;                        // forwards this micro-batch whose backward has not ended
  bool forwarded = false;              // ran forward this micro-batch (its prefetch was issued)
  // zero3 under PP: per micro-batch, its forwards whose gradients are not complete yet; the last
  // micro-batch forwarded (its prefetch was issued); the pipeline stage it runs in.
  std::map<int, int> pending;
  int last_forward = -1;
  int stage = 0;
};

struct Fsdp::Reduction {
  Param* param = nullptr;
  Tensor out;  // [rows * rest] f32: the summed gradient rows of this rank's shard
  Tensor wire;  // [rows * rest] in gradient_sync_dtype when not f32: what the reductions sum
  const Tensor& sent() const { return wire.defined() ? wire : out; }
  Work reduce_scatter, all_reduce;
  bool all_reduce_issued = false;
};

namespace {

thread_local int current_microbatch = 0;  // zero3 under PP: Fsdp::set_microbatch

Shape with_rows(const Shape& s, int64_t rows) {
  std::vector<int64_t> d(s.begin(), s.end());
  d[0] = rows;
  return Shape(d);
}

}  // namespace

Fsdp::Fsdp(nn::Module& model, const std::vector<nn::ShardingUnit>& units, const ProcessGroup& shard,
           const ProcessGroup* replicate, const FsdpOptions& options, const ProcessGroup* expert_shard)
    : shard_(shard),
      expert_shard_(expert_shard ? expert_shard : &shard),
      replicate_(replicate && replicate->size() > 1 ? replicate : nullptr),
      options_(options) {
  for (const nn::ShardingUnit& su : units) {
    auto u = std::make_unique<Unit>();
    u->name = su.name;
    u->module = su.module;
    u->reshard_after_forward = su.reshard_after_forward;
    u->index = units_.size();
    by_module_[su.module] = u.get();
    su.module->set_unit_hooks(this);
    units_.push_back(std::move(u));
  }
  auto root = std::make_unique<Unit>();
  root->name = "root";
  root->reshard_after_forward = false;
  root->index = units_.size();
  units_.push_back(std::move(root));

  for (auto& [name, p] : model.named_parameters()) {
    auto q = std::make_unique<Param>();
    q->name = name;
    q->p = p;
    q->group = p->expert_sharded ? expert_shard_ : &shard_;
    const int n = q->group->size(), r = q->group->rank();
    q->shape = p->var.shape();
    TITAN_CHECK(q->shape.size() >= 1, "FSDP shards parameters on dim 0; '" + name + "' is a scalar");
    q->d0 = q->shape[0];
    q->rest = q->shape.numel() / std::max<int64_t>(q->d0, 1);
    q->rows = (q->d0 + n - 1) / n;
    q->valid = std::clamp<int64_t>(q->d0 - int64_t(r) * q->rows, 0, q->rows);
    const Shape shard_shape = with_rows(q->shape, q->rows), full_shape = with_rows(q->shape, q->rows * n);
    q->shard = Tensor::zeros(shard_shape, DType::f32, MemCategory::parameters);
    Tensor master = q->shard.slice(0, 0, q->valid);
    std::vector<int64_t> offsets(q->shape.size(), 0);
    offsets[0] = int64_t(r) * q->rows;
    // In the global parameter: this rank's rows of its tensor-parallel shard (or of the whole).
    const GlobalSlice slice = nested_slice(p->slice, q->shape, Shape(offsets));
    nn::init_parameter(master, name, p->init, options.seed, &slice);
    q->bf16 = options.param_dtype != DType::f32 && p->gemm_weight;
    if (const auto it = options.fp8_all_gather.find(name); it != options.fp8_all_gather.end()) {
      setup_fp8_gather(*q, it->second, n);
    } else if (q->bf16) {
      q->shard_compute = Tensor::empty(shard_shape, options.param_dtype, MemCategory::parameters);
      q->compute_valid = q->shard_compute.slice(0, 0, q->valid);
      q->shard_compute.release_storage();
      q->full = Tensor::empty(full_shape, options.param_dtype, MemCategory::parameters);
      p->compute = q->full.slice(0, 0, q->d0);
      // The f32 value is never gathered (the GEMMs read the bf16 copy): a buffer of its shape, freed.
      Tensor unused = Tensor::empty(q->shape, DType::f32, MemCategory::parameters);
      unused.release_storage();
      p->var.mutable_value() = unused;
    } else {
      q->full = Tensor::empty(full_shape, DType::f32, MemCategory::parameters);
      p->var.mutable_value() = q->full.slice(0, 0, q->d0);
      p->compute = Tensor();
    }
    q->full.release_storage();
    p->var.clear_grad();
    q->trainable = trainables_.size();
    nn::TrainableParam t;
    t.name = name;
    t.var = autograd::Variable(master, true, name);
    t.compute = nullptr;  // the optimizer updates the master alone: gather() casts it
    t.weight_decay = p->weight_decay;
    t.slice = slice;
    t.tp_partial_grad = p->tp_partial_grad;
    t.tp_duplicate = p->tp_duplicate;
    t.tp_dim = p->tp_plan.dim;
    trainables_.push_back(std::move(t));
    Unit* owner = units_.back().get();  // root, unless a unit's prefix claims it
    for (auto& u : units_)
      if (u->module && name.starts_with(u->name + ".")) owner = u.get();
    owner->params.push_back(q.get());
    if (owner->params.size() == 1 && options.stage_of) owner->stage = options.stage_of(name);
    by_name_[name] = q.get();
    params_.push_back(std::move(q));
  }
  sums_.resize(trainables_.size());
}

void Fsdp::set_microbatch(int microbatch) { current_microbatch = microbatch; }

Fsdp::~Fsdp() {
  for (auto& u : units_) {
    for (const Work& w : u->gathers) w.settle();
    if (u->module) const_cast<nn::Module*>(u->module)->set_unit_hooks(nullptr);
  }
  for (auto& rd : reductions_) rd->reduce_scatter.settle(), rd->all_reduce.settle();
}

std::string Fsdp::describe() const {
  std::string out = replicate_ ? fmt::format("HSDP: parameters sharded over {} ranks, {} replicas", shard_.size(), replicate_->size())
                               : fmt::format("FSDP over {} ranks", shard_.size());
  if (expert_shard_ != &shard_)
    out += fmt::format(", routed experts over {} {}", expert_shard_->size(), expert_shard_->size() == 1 ? "rank" : "ranks");
  out += fmt::format(" ({} units + root; reshard after forward: {}; parameters gathered in {})", units_.size() - 1,
                     name_of(options_.reshard_after_forward), options_.param_dtype != DType::f32 ? std::string(dtype_name(options_.param_dtype)) + " for GEMM weights" : std::string("f32"));
  if (!options_.fp8_all_gather.empty())
    out += fmt::format("; FP8 all-gather of {} quantized weights", options_.fp8_all_gather.size());
  return out;
}

Fsdp::Unit& Fsdp::unit_of(const nn::Module& m) {
  auto it = by_module_.find(&m);
  TITAN_CHECK(it != by_module_.end(), "FSDP: a module's hooks ran but it is not one of the plan's units");
  return *it->second;
}

namespace {
constexpr int64_t kFp8Block = 128;  // FP8 blockwise weights' square blocks (autograd/quantized_linear.h)
}  // namespace

void Fsdp::setup_fp8_gather(Param& q, autograd::QuantizedWeight* cache, int n) {
  TITAN_CHECK(q.shape.size() == 2, "FSDP FP8 all-gather: '" + q.name + "' " + q.shape.str() + " is not a matrix",
              "only FP8 blockwise Linear weights gather as FP8");
  const int64_t k = q.rest, block_rows = (q.d0 + kFp8Block - 1) / kFp8Block, block_cols = (k + kFp8Block - 1) / kFp8Block;
  q.fp8 = cache;
  q.fp8_values = Tensor::zeros({q.rows, k}, DType::f32, MemCategory::parameters);
  q.amax_mine = Tensor::empty({block_rows, block_cols}, DType::f32, MemCategory::parameters);
  q.amax_all = Tensor::empty({int64_t(n), block_rows, block_cols}, DType::f32, MemCategory::parameters);
  q.fp8_scales = Tensor::empty({block_rows, block_cols}, DType::f32, MemCategory::parameters);
  q.codes_mine = Tensor::empty({q.rows, k}, DType::f8e4m3, MemCategory::parameters);
  if (q.bf16) {  // the bf16 rounding of the master, kept (the 1-rank path quantizes its bf16 copy)
    q.shard_compute = Tensor::empty({q.rows, k}, options_.param_dtype, MemCategory::parameters);
    q.compute_valid = q.shard_compute.slice(0, 0, q.valid);
  }
  q.full = Tensor::empty({int64_t(n) * q.rows, k}, DType::f8e4m3, MemCategory::parameters);
  // The layer reads its weight's adopted forms: its value (f32 or bf16) is never gathered.
  q.p->compute = Tensor();
  Tensor unused = Tensor::empty(q.shape, DType::f32, MemCategory::parameters);
  unused.release_storage();
  q.p->var.mutable_value() = unused;
}

void Fsdp::send_fp8_amax(Param& q) {
  // The values quantized: the master's rows, rounded to bf16 first under mixed precision.
  Tensor valid = q.fp8_values.slice(0, 0, q.valid);
  if (q.bf16) {
    q.compute_valid.copy_(trainables_[q.trainable].var.value());  // rounds
    valid.copy_(q.compute_valid);
  } else {
    valid.copy_(trainables_[q.trainable].var.value());
  }
  const int64_t row0 = int64_t(q.group->rank()) * q.rows;
  kernels::fp8_block_piece_amax(q.amax_mine, q.fp8_values, row0, q.d0, kFp8Block, kFp8Block);
  q.amax_gather = q.group->all_gather(q.amax_all.view({q.amax_all.numel()}), q.amax_mine.view({q.amax_mine.numel()}));
}

Work Fsdp::send_fp8_codes(Param& q) {
  q.amax_gather.wait();
  kernels::fp8_block_scales(q.fp8_scales, q.amax_all);
  const int64_t row0 = int64_t(q.group->rank()) * q.rows;
  kernels::fp8_block_piece_encode(q.codes_mine, q.fp8_values, q.fp8_scales, row0, q.d0, kFp8Block, kFp8Block);
  return q.group->all_gather(q.full.view({q.full.numel()}), q.codes_mine.view({q.codes_mine.numel()}));
}

void Fsdp::gather(Unit& u) {
  if (u.gathered || !u.gathers.empty()) return;
  // FP8 weights: every block-amax exchange first, so that one latency covers the unit.
  for (Param* q : u.params)
    if (q->fp8) send_fp8_amax(*q);
  for (Param* q : u.params) {
    q->full.reallocate_storage();
    if (q->fp8) {
      u.gathers.push_back(send_fp8_codes(*q));
      continue;
    }
    if (q->bf16) {  // the cast on the all-gather: the bf16 shard exists only while it is sent
      q->shard_compute.reallocate_storage();
      q->compute_valid.copy_(trainables_[q->trainable].var.value());  // copy_ rounds to bf16
      if (q->valid < q->rows) q->shard_compute.slice(0, q->valid, q->rows).zero_();
    }
    const Tensor& src = q->bf16 ? q->shard_compute : q->shard;
    const int n = q->group->size();
    u.gathers.push_back(q->group->all_gather(q->full.view({n * q->rows * q->rest}), src.view({q->rows * q->rest})));
  }
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes());
}

void Fsdp::wait_gathered(Unit& u) {
  for (const Work& w : u.gathers) w.wait();
  if (!u.gathers.empty())
    for (Param* q : u.params) {
      if (q->fp8) q->fp8->adopt_fp8_blockwise(q->full.slice(0, 0, q->d0), q->fp8_scales);
      else if (q->bf16) q->shard_compute.release_storage();  // sent: the gathered copy is what the GEMMs read
    }
  u.gathers.clear();
  u.gathered = true;
}

void Fsdp::release(Unit& u) {
  if (!u.gathered && u.gathers.empty()) return;
  wait_gathered(u);
  for (Param* q : u.params) q->full.release_storage();
  u.gathered = false;
}

Fsdp::Unit* Fsdp::prefetch_target(const Unit& u, int step) const {
  const int64_t i = int64_t(u.index) + step;
  // Never the root (gathered for the step), nor a unit of another pipeline stage (its work comes later).
  if (i < 0 || i + 1 >= int64_t(units_.size())) return nullptr;
  Unit* next = units_[size_t(i)].get();
  return next->stage == u.stage ? next : nullptr;
}

void Fsdp::before_forward(const nn::Module& m) {
  Unit& u = unit_of(m);
  gather(u);
  wait_gathered(u);
  if (reduces_per_microbatch()) {
    // A training forward of a micro-batch (validation and checkpointed regions' recomputes
    // record nothing): prefetch the next unit of the stage on its first forward of the micro-batch.
    const int mb = current_microbatch;
    const bool training = autograd::grad_enabled();
    if (training && u.last_forward != mb)
      if (Unit* next = prefetch_target(u, 1)) gather(*next);
    if (!training) return;
    u.last_forward = mb;
    ++u.uses;
    ++u.pending[mb];
    autograd::record_hook("fsdp.post_backward " + u.name, [this, &u, mb] { post_backward_microbatch(u, mb); });
    return;
  }
  // Prefetch the next unit (not the root), on the unit's first forward only: a second use (the
  // MTP modules reuse the embedding and the head) is not followed by the unit after it.
  if (!u.forwarded && u.index + 2 < units_.size()) gather(*units_[u.index + 1]);
  u.forwarded = true;
  if (!autograd::grad_enabled()) return;
  ++u.uses;
  // Runs once the unit's whole backward has run (it is recorded before the unit's ops).
  autograd::record_hook("fsdp.post_backward " + u.name, [this, &u] { post_backward(u); });
}

bool Fsdp::reshards_after_forward(const Unit& u) const {
  switch (options_.reshard_after_forward) {
    case ReshardAfterForward::always: return true;
    case ReshardAfterForward::never: return false;
    // Under PP per step a unit's parameters stay gathered over the step (FsdpOptions::pipeline).
    case ReshardAfterForward::per_unit: return u.reshard_after_forward && !(options_.pipeline && options_.pipeline_per_step);
  }
  return true;
}

void Fsdp::after_forward(const nn::Module& m) {
  Unit& u = unit_of(m);
  const bool training = autograd::grad_enabled();
  // Runs before the unit's backward (it is recorded after the unit's ops).
  if (training) autograd::record_hook("fsdp.pre_backward " + u.name, [this, &u] { pre_backward(u); });
  if (!training || reshards_after_forward(u)) release(u);
}

void Fsdp::pre_backward(Unit& u) {
  gather(u);
  wait_gathered(u);
  if (reduces_per_microbatch()) {
    if (Unit* previous = prefetch_target(u, -1)) gather(*previous);  // its backward comes next in this stage
  } else if (u.index > 0) {
    gather(*units_[u.index - 1]);  // prefetch the unit whose backward comes next
  }
}

void Fsdp::post_backward_microbatch(Unit& u, int microbatch) {
  // B and I are done with the parameters (W needs none): free them unless the unit keeps them
  // after forward and another micro-batch's backward of it is still to come.
  if (--u.uses == 0 || reshards_after_forward(u)) release(u);
  // Under a split backward (I now, W later) the unit's weight GEMMs were queued before this hook
  // ran: a marker queued behind them completes the micro-batch's gradient when W runs them.
  const auto done = [this, &u, microbatch] { unit_microbatch_done(u, microbatch); };
  if (autograd::WeightGradQueue* later = autograd::deferred_weight_grads()) later->push(done);
  else done();
}

void Fsdp::unit_microbatch_done(Unit& u, int microbatch) {
  const auto it = u.pending.find(microbatch);
  TITAN_CHECK(it != u.pending.end(), "FSDP: unit " + u.name + " finished a backward of micro-batch " +
                                         std::to_string(microbatch) + " it never ran forward");
  if (--it->second > 0) return;  // another stage's forward of the unit (MTP's embedding) still has its backward to run
  u.pending.erase(it);
  // As without PP: the reductions issued before (the previous unit's) finish first and join the
  // sums, so at most this unit's unsharded gradients and one in flight exist at once.
  advance_reductions(true);
  reduce_gradients(u);
  advance_reductions(false);
}

bool Fsdp::reduce_microbatch_gradient(const std::string& name, const Tensor& grad) {
  const auto it = by_name_.find(name);
  TITAN_CHECK(it != by_name_.end(), "FSDP: no parameter " + name);
  Param& q = *it->second;
  if (std::find(units_.back()->params.begin(), units_.back()->params.end(), &q) == units_.back()->params.end())
    return false;
  advance_reductions(true);
  q.p->var.slot()->grad = grad;
  q.p->var.slot()->stale = false;
  reduce_param(q);
  advance_reductions(false);
  return true;
}

void Fsdp::post_backward(Unit& u) {
  if (options_.pipeline) {  // the gradients wait for finish_backward (the deferred W's write them later)
    --u.uses;
    if (options_.reshard_after_forward == ReshardAfterForward::always) release(u);
    return;
  }
  if (--u.uses > 0) return;  // another forward of the unit (e.g. the MTP head) still has its backward to run
  // FSDP2's bound on gradient memory: the reduce-scatters issued after the previous unit's
  // backward (which overlapped this unit's) finish before this unit's are issued, so at most two
  // units' unsharded gradients exist at once, however slowly the engine sends.
  for (auto& rd : reductions_) rd->reduce_scatter.wait();
  reduce_gradients(u);
  release(u);
  advance_reductions(false);
}

void Fsdp::reduce_gradients(Unit& u) {
  for (Param* q : u.params) reduce_param(*q);
}

void Fsdp::reduce_param(Param& q) {
  // Whether to reduce is decided by what every rank agrees on (frozen or not), never by this
  // rank's gradient alone, or the ranks' collectives would go out of step: a parameter no
  // gradient reached here sends zeros.
  if (!q.p->var.requires_grad()) return;
  const int n = q.group->size();
  const Tensor& g = q.p->var.grad();
  const int64_t total = n * q.rows * q.rest, given = q.d0 * q.rest;
  const DType wire = options_.gradient_sync_dtype;
  Tensor in = g.defined() ? g.view({given}) : Tensor();
  SendBuffer* staged = nullptr;
  if (!in.defined() || wire != DType::f32 || given != total) {
    // Into a kept send buffer: cast to the wire's dtype, padded with zeros to N equal chunks.
    staged = &send_buffer(total, wire);
    Tensor buf = staged->data.slice(0, 0, total);
    Tensor head = buf.slice(0, 0, given);
    if (!in.defined()) buf.zero_();
    else if (wire != DType::f32) kernels::cast(head, in.contiguous());
    else head.copy_(in);
    if (in.defined() && given < total) buf.slice(0, given, total).zero_();
    in = buf;
  }
  auto rd = std::make_unique<Reduction>();
  rd->param = &q;
  rd->out = Tensor::empty({q.rows * q.rest}, DType::f32, MemCategory::gradients);
  if (wire != DType::f32) rd->wire = Tensor::empty({q.rows * q.rest}, wire, MemCategory::gradients);
  rd->reduce_scatter = q.group->reduce_scatter(rd->sent(), in);
  if (staged) staged->busy = rd->reduce_scatter;
  reductions_.push_back(std::move(rd));
  q.p->var.clear_grad();  // the request holds the unsharded gradient until it is sent
}

Fsdp::SendBuffer& Fsdp::send_buffer(int64_t numel, DType dtype) {
  // The smallest idle buffer that fits; else an idle one grown; else a new one. The step's
  // reductions repeat in the same order, so after the first step no buffer is allocated.
  SendBuffer *fit = nullptr, *idle = nullptr;
  for (auto& b : send_buffers_) {
    if (b->data.dtype() != dtype || !b->busy.completed()) continue;
    idle = b.get();
    if (b->data.numel() >= numel && (!fit || b->data.numel() < fit->data.numel())) fit = b.get();
  }
  if (fit) return *fit;
  if (!idle) idle = send_buffers_.emplace_back(std::make_unique<SendBuffer>()).get();
  idle->data = Tensor::empty({numel}, dtype, MemCategory::temporaries);
  return *idle;
}

void Fsdp::advance_reductions(bool wait) {
  // HSDP: each shard's gradient is all-reduced over the replicas once its reduce-scatter is done,
  // in issue order on every rank (the order MPI needs), without waiting unless asked to.
  if (replicate_)
    for (auto& rd : reductions_) {
      if (rd->all_reduce_issued) continue;
      if (!wait && !rd->reduce_scatter.completed()) break;
      rd->reduce_scatter.wait();
      rd->all_reduce = replicate_->all_reduce(rd->sent());
      rd->all_reduce_issued = true;
    }
  if (!wait) return;
  for (auto& rd : reductions_) {
    rd->reduce_scatter.wait();
    rd->all_reduce.wait();
    if (rd->wire.defined()) kernels::cast(rd->out, rd->wire);  // into f32 for the step's sums
    Param& q = *rd->param;
    fold(q.trainable, rd->out.slice(0, 0, q.valid * q.rest));  // the valid rows, flat
  }
  reductions_.clear();
}

void Fsdp::fold(size_t trainable, const Tensor& g) {
  TreeSum& sum = sums_[trainable];
  if (!options_.sum_in_place || sum.empty()) {
    sum.add(g);
    return;
  }
  // In place: one partial sum (a TreeSum of one leaf), the micro-batches added to it in order.
  Tensor acc = sum.take();
  float* a = acc.data<float>();
  const float* b = g.data<float>();
  for (int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
  sum.add(acc);
}

void Fsdp::zero_grad() {
  in_step_ = true;
  micro_batches_ = 0;
  // No shard gradient is held while the step runs: finish_backward gives each its sum (a zero one
  // to a trainable parameter no gradient reached, which still steps; none to a frozen one, which
  // the optimizer skips).
  for (auto& q : params_) {
    trainables_[q->trainable].var.clear_grad();
    q->p->var.clear_grad();
  }
  for (auto& u : units_) u->last_forward = -1, u->pending.clear();
}

void Fsdp::begin_forward(bool /*sync_gradients*/) {
  for (auto& u : units_) u->forwarded = false;
  // The previous micro-batch's reductions are folded into the step's sums (they ran during its
  // backward; waiting here rarely waits).
  if (in_step_ && micro_batches_++ > 0 && !reduces_per_microbatch()) {
    reduce_gradients(*units_.back());  // the root's, per micro-batch like every unit's
    advance_reductions(true);
  }
  Unit& root = *units_.back();
  gather(root);
  if (units_.size() > 1) gather(*units_[0]);
  wait_gathered(root);
}

void Fsdp::finish_backward() {
  for (auto& u : units_)
    TITAN_CHECK(u->uses == 0, "FSDP: the backward of unit " + u->name + " did not finish (its hook never ran)",
                "every forward of a unit must be part of the loss's backward");
  if (options_.pipeline && options_.pipeline_per_step)  // one reduce-scatter per parameter per step, after the last W
    for (auto& u : units_)
      if (u.get() != units_.back().get()) reduce_gradients(*u);
  if (!reduces_per_microbatch()) reduce_gradients(*units_.back());  // zero3: the root's went per micro-batch
  for (auto& u : units_)
    TITAN_CHECK(u->pending.empty(), "FSDP: unit " + u->name + " has a micro-batch whose weight gradients never ran");
  advance_reductions(true);
  for (auto& u : units_) release(*u);
  // The step's shard gradients; a trainable parameter no gradient reached gets a zero one.
  for (auto& q : params_) {
    const size_t i = q->trainable;
    const std::shared_ptr<autograd::GradSlot>& slot = trainables_[i].var.slot();
    if (!sums_[i].empty()) slot->grad = sums_[i].take().view(trainables_[i].var.shape());
    else if (q->p->var.requires_grad()) slot->grad = Tensor::zeros(trainables_[i].var.shape(), DType::f32, MemCategory::gradients);
    slot->stale = false;
  }
  in_step_ = false;
}

void Fsdp::finish_forward() {
  for (auto& u : units_) {
    u->uses = 0;
    u->pending.clear();
    release(*u);
  }
}

// Nothing to refresh: the bf16 copies are cast from the masters at every gather.
void Fsdp::refresh_compute_copies() {}

double Fsdp::sum_over_shards(double local) const {
  // Under EP too: the shard group's ranks x TP hold every routed expert's pieces once.
  double v = local;
  shard_.all_reduce(std::span<double>(&v, 1));
  return v;
}

bool Fsdp::writes_params() const { return !replicate_ || replicate_->rank() == 0; }

int64_t Fsdp::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& q : params_)
    if (q->full.storage_allocated()) bytes += int64_t(q->full.nbytes());
  return bytes;
}

}  // namespace titan::distributed
