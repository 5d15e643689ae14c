#include "titan/core/clock.h"
#include "titan/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/autograd/ops.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/distributed/ddp.h"
#include "titan/distributed/device_mesh.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/distributed/fsdp.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/distributed/runtime.h"
#include "titan/core/allocator.h"
#include "titan/core/cpu_features.h"
#include "titan/core/profiler.h"
#include "titan/core/trace.h"
#include "titan/core/rng.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/kernels/peak.h"
#include "titan/models/causal_lm.h"
#include "titan/models/family.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/optim/muon_adamw.h"
#include "titan/optim/swapped_moments.h"
#include "titan/train/checkpointing.h"
#include "titan/train/hf_checkpoint.h"
#include "titan/train/loss_scaler.h"
#include "titan/train/machine_peak.h"
#include "titan/train/metrics_window.h"
#include "titan/train/metrics.h"
#include "titan/train/plots.h"
#include "titan/train/stop_request.h"
#include "titan/train/pipeline_step.h"
#include "titan/checkpoint/async_save.h"

namespace titan::train {

namespace fs = std::filesystem;
using autograd::Variable;
using nlohmann::json;

namespace {

// How many of each kind of abandoned checkpoint folder (step-N.tmp, .corrupt) a start keeps.
constexpr int kAbandonedKept = 2;


// <run>/progress.json: the last step finished, the step this process resumed from and the newest
// full checkpoint it committed (-1: none yet), for a supervisor (`titan launch`) to see how far a
// run got, when a restarted one trains again, and where a restart resumes. Replaced whole
// (rename), never seen half written.
void write_progress(const fs::path& run, int64_t step, double loss, int64_t resumed_from, int64_t checkpoint) {
  const fs::path tmp = run / "progress.json.tmp";
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream(tmp) << json{{"step", step}, {"loss", loss}, {"resumed_from", resumed_from}, {"checkpoint", checkpoint},
                             {"time", now}}
                            .dump();
  std::error_code ec;
  fs::rename(tmp, run / "progress.json", ec);
}

// The model's parameters, counting each tensor-parallel shard's whole parameter once.
int64_t global_parameters(nn::Module& model) {
  int64_t n = 0;
  for (const auto& [name, p] : model.named_parameters())
    n += p->slice.global_shape.empty() ? p->var.value().numel() : p->slice.global_shape.numel();
  return n;
}

}  // namespace

void check_supported(const JobConfig& c, const std::string& source) {
  const Parallelism& p = c.parallelism;
  if (p.pipeline_parallel_degree > 1) {
    try {  // the schedule's own checks first (e.g. too few micro-batches), before the mesh's
      distributed::pp::make_schedule(p.pipeline_parallel_schedule, int(p.pipeline_parallel_degree),
                                     int(c.training.local_batch_size / p.pipeline_parallel_microbatch_size));
    } catch (const Error& e) {
      TITAN_FAIL(source + ": " + e.message(), e.hint());
    }
  }
  const int64_t tp = p.tensor_parallel_degree;
  const int64_t cp = p.context_parallel_degree;
  TITAN_CHECK(tp < 1 || (c.training.local_batch_size * c.training.seq_len) % tp == 0,
              source + ": training.local_batch_size x training.seq_len = " +
                  std::to_string(c.training.local_batch_size * c.training.seq_len) +
                  " tokens do not split over parallelism.tensor_parallel_degree = " + std::to_string(tp) +
                  " sequence-parallel ranks",
              "make seq_len a multiple of tensor_parallel_degree");
  TITAN_CHECK(tp < 1 || !c.validation.enable ||
                  (c.validation.local_batch_size * c.validation.seq_len) % tp == 0,
              source + ": validation.local_batch_size x validation.seq_len do not split over parallelism."
                       "tensor_parallel_degree = " + std::to_string(tp) + " sequence-parallel ranks",
              "make validation.seq_len a multiple of tensor_parallel_degree");
  for (const auto& [key, len] : {std::pair<const char*, int64_t>{"training.seq_len", c.training.seq_len},
                                 {"validation.seq_len", c.validation.enable ? c.validation.seq_len : 0}}) {
    TITAN_CHECK(cp < 1 || len % (2 * cp) == 0,
                source + ": " + key + " = " + std::to_string(len) + " does not split into 2 x context_parallel_degree = " +
                    std::to_string(2 * cp) + " chunks (context-parallel rank r holds chunks r and " +
                    std::to_string(2 * cp - 1) + " - r)",
                "make it a multiple of " + std::to_string(2 * cp) + ", e.g. " + std::to_string((len / (2 * cp) + 1) * (2 * cp)));
    // Under CP each rank holds 2 head-tail chunks of every sequence, which TP then splits.
    TITAN_CHECK(tp <= 1 || cp <= 1 || len % (2 * cp * tp) == 0,
                source + ": " + key + " = " + std::to_string(len) + " does not split into 2 x context_parallel_degree x "
                "tensor_parallel_degree = " + std::to_string(2 * cp * tp) + " pieces (each rank's two head-tail chunks, "
                "split over its TP ranks)",
                "make it a multiple of " + std::to_string(2 * cp * tp));
  }
  for (const auto& [key, on] : {std::pair{"checkpoint.initial_load_in_hf", c.checkpoint.initial_load_in_hf},
                                {"checkpoint.last_save_in_hf", c.checkpoint.last_save_in_hf}})
    TITAN_CHECK(!on || models::model_family(c.model.name).hf != nullptr,
                source + ": " + key + " = true, but model " + c.model.name + " has no Hugging Face conversion",
                std::string("set ") + key + " = false");
}

namespace {

// The dataset folders and the tokenizer file the config names exist.
void check_inputs(const JobConfig& c, const std::string& source) {
  TITAN_CHECK(!c.training.dataset_path.empty(), source + ": training.dataset_path is empty",
              "point it at a folder made by `titan data prepare` (it holds train/ and val/)");
  const auto check_folder = [&](const std::string& key, const std::string& path) {
    TITAN_CHECK(fs::is_directory(path), source + ": " + key + " = \"" + path + "\" is not a folder",
                "run scripts/prepare_data.sh to make ./data/kjv (the default corpus, the King James Bible, and "
                "its tokenizer ./data/kjv_tokenizer.json), or point " + key +
                    " at a folder made by `titan data prepare`");
  };
  check_folder("training.dataset_path", c.training.dataset_path);
  if (c.validation.enable && !c.validation.dataset_path.empty())
    check_folder("validation.dataset_path", c.validation.dataset_path);
  const std::string& tok = c.model.tokenizer_path;
  TITAN_CHECK(tok.empty() || fs::is_regular_file(tok),
              source + ": model.tokenizer_path = \"" + tok + "\" is not a file",
              "run scripts/prepare_data.sh to make ./data/kjv_tokenizer.json (with the ./data/kjv it prepared), or "
              "point model.tokenizer_path at the tokenizer.json the dataset was prepared with");
}

}  // namespace

// What one optimizer step produced, for the metrics.
struct StepOutcome {
  double loss = 0;  // cross-entropy, the mean over the step's micro-batches
  std::map<std::string, double> terms;  // each auxiliary loss, the same mean
  double grad_norm = 0;
  double lr = 0;
  double data_seconds = 0;  // spent waiting for the loader
  // A non-finite loss or gradient norm (fault.on_nonfinite "skip" or "rollback"): what happened,
  // and whether the update was skipped or the run must roll back.
  std::string fault;
  bool skipped = false, rollback = false;
  bool overflow = false;  // skipped by the loss scaler, which backed off (fault says so)
};

struct Trainer::State {
  JobConfig cfg;
  std::string source;
  fs::path run_folder, checkpoint_root;
  // checkpoint.initial_load_path, or where rank 0 converted it (checkpoint.initial_load_in_hf).
  fs::path initial_load;
  distributed::CommEngine* engine = nullptr;
  const distributed::ProcessGroup* world = nullptr;  // the ranks of this run
  std::unique_ptr<distributed::DeviceMesh> mesh;
  bool lead = true;  // world rank 0: prints, writes the run folder's files
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<distributed::DataParallel> dp;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<data::DataLoader> train_loader, val_loader;
  std::unique_ptr<PipelineStep> pipeline;  // pipeline parallelism (null: none)
  std::set<std::string> other_stages;      // what the other pipeline ranks hold (checkpoints)
  std::unique_ptr<checkpoint::AsyncSaver> saver;  // checkpoint.async_mode = "async"
  std::set<int64_t> skipped_steps;                // steps whose batch a rollback skips
  std::optional<LossScaler> scaler;               // training.loss_scaling (none: unset)
  optim::LrSchedule schedule;
  int64_t accum = 1;
  int64_t step = 0;  // optimizer steps completed
  int64_t committed_step = -1;  // the newest full checkpoint this process committed
  Tensor inputs, targets;  // [B, S] i32, reused every micro-batch
  json hf_config;  // the architecture, when it comes from a checkpoint converted from Hugging Face

  explicit State(const JobConfig& c) : cfg(c), schedule(make_lr_schedule(c)) {
    const Training& t = c.training;
    if (t.scales_loss())
      scaler.emplace(LossScalerOptions{t.loss_scale_init, t.loss_scale_growth_factor, t.loss_scale_backoff_factor,
                                       t.loss_scale_growth_interval, t.loss_scale_min});
  }
  double loss_scale() const { return scaler ? scaler->scale() : 1.0; }

  // One optimizer step: every micro-batch's forward, loss and backward, then clipping, the
  // optimizer and the model's own end-of-step updates.
  StepOutcome train_step(MetricsLogger& log);
  void save(bool final_save);
  // A committed checkpoint: old ones purged (keep_latest_k), the folder named.
  void on_committed(const fs::path& dir, bool model_only = false);
  void restore(const fs::path& folder, bool model_only);
  // Resume from the newest full checkpoint (not a weights-only export) that loads: a damaged one
  // (checksum, format, a file no rank sees) is reported, renamed step-<N>.corrupt and the one
  // before it tried; an I/O error ends the run, leaving it in place. Rank 0 chooses. Collective.
  // at_most: the newest step to consider (a restart under `titan launch` of a run that pinned
  // checkpoint.load_step: what the job committed since).
  std::optional<fs::path> resume_from_latest(int64_t at_most = std::numeric_limits<int64_t>::max());
  // Rank 0's answer (its error, every rank's): ranks never choose a checkpoint each on their own,
  // since on a shared file system one rank's directory listing can lag. Collective.
  std::string from_rank0(const std::function<std::string()>& answer);
  // Back to the newest committed checkpoint after a non-finite step, which is then skipped.
  void roll_back(int64_t bad_step, MetricsLogger& log);
  // Collective: "" when the step's loss and gradient norm are finite on every rank, else what is
  // not and on which ranks.
  std::string nonfinite(bool local_bad, double loss, double norm, const std::string& where);
  void inject_fault();
  // The gradients were of the scaled loss: the norm becomes the true one and the optimizer's
  // grad_scale (which the fused step multiplies in) divides by the loss scale, then clips as
  // clip_grad_norm would have on the unscaled gradients: unscaling before clipping, in one pass.
  void unscale(optim::GradNorm& norm, double max_norm) const {
    const double s = scaler->scale();
    norm.norm /= s;
    const double clip = max_norm > 0 ? std::min(1.0, max_norm / (norm.norm + 1e-6)) : 1.0;
    norm.scale = float(clip / s);
  }
  // checkpoint.initial_load_in_hf (rank 0): the Hugging Face folder as a checkpoint,
  // <run>/hf_import/step-0, converted once (a restart reuses it) as `titan ckpt convert --from-hf`.
  fs::path import_hf(const fs::path& hf_dir);
  // checkpoint.last_save_in_hf (rank 0): the final save's weights as a Hugging Face folder beside
  // it, <checkpoint>/step-<N>-hf (not a step folder: never resumed from, never purged).
  void export_hf(const fs::path& saved);
  // A step whose update is dropped drops its MoE routing counts too (they never join an update).
  void discard_step_counts() {
    for (auto& [name, b] : model->named_buffers(nn::BufferKind::step_statistic)) b.zero_();
  }
  double validate();
  RunParts parts() { return {*model, *dp, *opt, *world, writes_buffers(), &other_stages}; }
  // The first rank of each pipeline stage writes the stage's buffers (rank 0 without PP).
  bool writes_buffers() const {
    using distributed::MeshDim;
    for (MeshDim d : {MeshDim::dp_replicate, MeshDim::dp_shard, MeshDim::cp, MeshDim::tp})
      if (mesh->coordinate(d) != 0) return false;
    return true;
  }
  // The mean over the data-parallel ranks (the loss mesh) of each value.
  void mean_over_data(std::vector<double>& values);
  int64_t dp_degree() const { return mesh->dp().size(); }
  // The trace of the step just done / the memory live at its peak, into the run folder.
  void write_trace(MetricsLogger& log);
  void write_memory_snapshot(MetricsLogger& log);
  void draw_plots(MetricsLogger& log) const;
  fs::path profile_file(const std::string& folder, const std::string& suffix) const {
    return run_folder / folder / ("iteration_" + std::to_string(step)) / ("rank" + std::to_string(world->rank()) + suffix);
  }
  // Whether Ctrl-C reached any rank: they reach the ranks at different moments, and all must
  // agree on the step that saves and ends the run.
  bool any_rank_stopped() {
    double stop = stop_requested() ? 1 : 0;
    if (world->size() > 1) world->all_reduce(std::span<double>(&stop, 1), distributed::ReduceOp::max);
    return stop > 0;
  }
};

// The quantize.* converters [model] converters names, with their [quantize.*] sections' keys.
models::QuantizeOptions quantize_options(const JobConfig& c) {
  models::QuantizeOptions q;
  auto named = [&](const char* n) {
    return std::find(c.model.converters.begin(), c.model.converters.end(), n) != c.model.converters.end();
  };
  const bool linear_f8 = named(models::kQuantizeLinearFloat8), linear_mx = named(models::kQuantizeLinearMx);
  const bool grouped_f8 = named(models::kQuantizeGroupedMmFloat8), grouped_mx = named(models::kQuantizeGroupedMmMx);
  TITAN_CHECK(!(linear_f8 && linear_mx), "model.converters names both quantize.linear.float8 and quantize.linear.mx",
              "keep one recipe for the linear layers");
  TITAN_CHECK(!(grouped_f8 && grouped_mx),
              "model.converters names both quantize.grouped_mm.float8 and quantize.grouped_mm.mx",
              "keep one recipe for the routed experts");
  if (linear_f8 || linear_mx) {
    const QuantizeLinear& k = linear_f8 ? c.quantize_linear_float8 : c.quantize_linear_mx;
    const char* name = linear_f8 ? models::kQuantizeLinearFloat8 : models::kQuantizeLinearMx;
    q.linear = models::QuantizeSelection{models::quantize_recipe(name, k.recipe_name), k.filter_fqns};
  }
  if (grouped_f8 || grouped_mx) {
    const QuantizeGroupedMm& k = grouped_f8 ? c.quantize_grouped_mm_float8 : c.quantize_grouped_mm_mx;
    const char* name = grouped_f8 ? models::kQuantizeGroupedMmFloat8 : models::kQuantizeGroupedMmMx;
    q.grouped_mm = models::QuantizeSelection{models::quantize_recipe(name, k.recipe_name), k.fqns};
  }
  return q;
}

namespace {

models::ModelOptions model_options(const JobConfig& c, const json* hf_config, const distributed::DeviceMesh& mesh) {
  models::ModelOptions mo;
  mo.tp = &mesh.group(distributed::MeshDim::tp);
  mo.moe_tp_gather = c.parallelism.experts_split_over_tp();
  mo.async_tp = c.parallelism.enable_async_tensor_parallel;
  mo.cp = &mesh.group(distributed::MeshDim::cp);
  mo.ep = &mesh.ep();
  mo.mtp_layers = c.model.mtp_layers;
  mo.mtp_loss_weight = c.model.mtp_loss_weight;
  mo.hf_config = hf_config;
  mo.moe_load_balance_coeff = c.model.moe_load_balance_coeff;
  mo.moe_aux_loss_alpha = c.model.moe_aux_loss_alpha;
  mo.converters = c.model.converters;
  mo.quantize = quantize_options(c);
  mo.dsa = {c.dsa.warmup_steps, c.dsa.indexer_loss_coeff, c.dsa.topk};
  return mo;
}

kernels::AdamWParams adamw_params(const JobConfig& c) {
  kernels::AdamWParams oc;
  oc.lr = float(c.optimizer.lr);
  oc.beta1 = float(c.optimizer.beta1);
  oc.beta2 = float(c.optimizer.beta2);
  oc.eps = float(c.optimizer.eps);
  oc.weight_decay = float(c.optimizer.weight_decay);
  return oc;
}

void print_swapped(const char* what, const optim::SwappedMoments& m) {
  std::printf("%s swapped to %s: %.1f MiB on disk per rank, %lld chunks, %.1f MiB in memory\n", what,
              m.store().describe().c_str(), double(m.stored_bytes()) / (1 << 20), (long long)m.chunk_count(),
              double(m.resident_bytes()) / (1 << 20));
}

// [optimizer] name over the optimizer's parameters (params: whole, or this rank's pieces); rank 0
// (lead) says where the state lives and, under Muon, which parameters go to which optimizer.
// Muon's matrices split over ranks go to an owner each (muon.h): FSDP's rows over the shard group,
// tensor-parallel ones (with FSDP's rows of each TP slice) over dp_shard x cp x tp.
std::unique_ptr<optim::Optimizer> make_optimizer(const JobConfig& c, models::CausalLM& model,
                                                 const std::vector<nn::TrainableParam>& params,
                                                 const distributed::DeviceMesh& mesh,
                                                 const std::optional<optim::Swap>& swap, bool lead,
                                                 const std::string& source) {
  switch (c.optimizer.name) {
    case OptimizerKind::adamw: {
      auto opt = std::make_unique<optim::AdamW>(params, adamw_params(c), swap);
      if (lead && opt->swapped()) print_swapped("optimizer state", *opt->swapped());
      return opt;
    }
    case OptimizerKind::muon: {
      optim::MuonParamGroups groups = optim::split_muon_groups(params, model.named_parameters());
      if (lead) std::printf("optimizer groups:\n%s\n", optim::describe_muon_groups(groups).c_str());
      optim::MuonConfig mc;
      mc.momentum = c.optimizer.muon_momentum;
      mc.nesterov = c.optimizer.muon_nesterov;
      mc.weight_decay = c.optimizer.weight_decay;
      mc.ns_steps = int(c.optimizer.muon_ns_steps);
      mc.adjust = c.optimizer.muon_adjust_lr;
      mc.ns_dtype = c.optimizer.muon_ns_dtype;
      const double scale = c.optimizer.muon_lr.value_or(c.optimizer.lr) / c.optimizer.lr;
      const distributed::ProcessGroup* shard = mesh.fsdp().size() > 1 ? &mesh.fsdp() : nullptr;
      const distributed::ProcessGroup* tp_shard = mesh.degree(distributed::MeshDim::tp) > 1 ? &mesh.fsdp_tp() : nullptr;
      std::unique_ptr<optim::MuonAdamW> opt;
      try {
        opt = std::make_unique<optim::MuonAdamW>(std::move(groups), mc, scale, adamw_params(c), swap, shard, tp_shard);
      } catch (const Error& e) {
        TITAN_FAIL(source + ": " + e.message(), e.hint());
      }
      const optim::Muon& muon = opt->muon();
      if (lead && muon.split_matrices() > muon.tp_split_matrices())
        std::printf("Muon under FSDP: %d matrices split over %d ranks, each orthogonalised by an owner (%d here); "
                    "%.2f MiB exchanged per step by this rank\n",
                    muon.split_matrices() - muon.tp_split_matrices(), shard->size(),
                    muon.owned_matrices() - muon.tp_owned_matrices(),
                    double(muon.exchanged_elements() - muon.tp_exchanged_elements()) * 4 / (1 << 20));
      if (lead && muon.tp_split_matrices() > 0)
        std::printf("Muon under TP: %d matrices split over %d ranks (dp_shard x cp x tp), each orthogonalised by an "
                    "owner (%d here); %.2f MiB exchanged per step by this rank\n",
                    muon.tp_split_matrices(), tp_shard->size(), muon.tp_owned_matrices(),
                    double(muon.tp_exchanged_elements()) * 4 / (1 << 20));
      if (lead && opt->adamw().swapped()) print_swapped("AdamW's moments", *opt->adamw().swapped());
      if (lead && opt->muon().swapped()) print_swapped("Muon's momentum buffers", *opt->muon().swapped());
      return opt;
    }
  }
  TITAN_FAIL("optimizer.name: no such optimizer");
}

// The data-parallel layout the mesh asks for: FSDP (HSDP with replicas) when dp_shard x cp > 1, DDP
// when only dp_replicate > 1, else one rank. FSDP initializes the shards itself; the others
// initialize the whole model. Under expert parallelism FSDP shards the routed experts over the
// expert-FSDP group; without FSDP that group is this rank alone (EP took all of dp_shard x cp x tp).
std::unique_ptr<distributed::DataParallel> make_data_parallel(models::CausalLM& model, const distributed::DeviceMesh& mesh,
                                                              const JobConfig& c, const std::string& source,
                                                              const PipelinePlan* pipeline) {
  using distributed::MeshDim;
  const uint64_t seed = uint64_t(c.debug.seed);
  std::vector<nn::ShardingUnit> units;
  // Context-parallel ranks hold the same parameters and sum their gradients: FSDP shards over them.
  if (mesh.dp().size() > 1 || mesh.fsdp().size() > 1) {
    try {
      units = model.sharding_units();
    } catch (const Error& e) {
      TITAN_FAIL(source + ": " + e.message(), e.hint());
    }
  }
  const bool fp8_gather = c.quantize_linear_float8.enable_fsdp_float8_all_gather;
  TITAN_CHECK(!fp8_gather || mesh.fsdp().size() > 1,
              source + ": quantize.linear.float8.enable_fsdp_float8_all_gather = true, but the parameters are not "
                       "sharded (FSDP over " + std::to_string(mesh.fsdp().size()) + " rank)",
              "run with parallelism.data_parallel_shard_degree > 1, or set enable_fsdp_float8_all_gather = false");
  if (mesh.fsdp().size() > 1) {
    distributed::FsdpOptions o;
    if (fp8_gather) o.fp8_all_gather = models::fp8_blockwise_weights(model);
    o.reshard_after_forward = c.parallelism.fsdp_reshard_after_forward;
    o.param_dtype = model.compute_dtype();
    o.gradient_sync_dtype = c.training.gradient_sync_dtype;
    o.seed = seed;
    o.pipeline = mesh.degree(MeshDim::pp) > 1;
    o.pipeline_per_step = c.parallelism.pipeline_parallel_fsdp == PipelineFsdp::per_step;
    o.sum_in_place = o.pipeline && !c.parallelism.pipeline_tree_sum();
    if (pipeline) {
      bool mtp = false;
      for (const auto& [name, p] : model.named_parameters()) mtp = mtp || name.starts_with("mtp.");
      o.stage_of = [plan = *pipeline, mtp](const std::string& name) {
        const std::vector<int> st = stages_using(plan, name, mtp);
        return st.empty() ? -1 : st.front();
      };
    }
    return std::make_unique<distributed::Fsdp>(model, units, mesh.fsdp(), &mesh.group(MeshDim::dp_replicate), o,
                                               mesh.ep().size() > 1 ? &mesh.efsdp() : nullptr);
  }
  model.init_parameters(seed);
  model.refresh_compute_copies();
  if (mesh.degree(MeshDim::dp_replicate) > 1)
    return std::make_unique<distributed::Ddp>(model, units, mesh.group(MeshDim::dp_replicate), int64_t(25) << 20,
                                              /*pipeline=*/mesh.degree(MeshDim::pp) > 1, c.training.gradient_sync_dtype);
  return std::make_unique<distributed::SingleRank>(model);
}

}  // namespace

Trainer::Trainer(const JobConfig& config, const std::string& source, const distributed::ProcessGroup* world)
    : s_(std::make_unique<State>(config)) {
  State& s = *s_;
  s.source = source;
  check_supported(config, source);
  check_inputs(config, source);
  flush_denormals(true);  // see core/cpu_features.h: sharpening attention makes denormals
  // Memory snapshots name the op behind every block: track them from before the model exists.
  if (config.profiling.enable_memory_snapshot) memory_track_blocks(true);
  // MPI's start-up and the mesh's splits block the communication thread: they have the start-up
  // deadline, and a dump goes where the watchdog's do.
  distributed::CommEngine::get().set_init_timeout(double(config.comm.init_timeout_seconds));
  distributed::CommEngine::get().set_trace_folder(fs::path(config.job.dump_folder) / config.comm.save_traces_folder);
  s.engine = &distributed::init_runtime();
  s.world = world ? world : &s.engine->world();
  s.lead = s.world->rank() == 0;
  s.run_folder = config.job.dump_folder;
  s.checkpoint_root = s.run_folder / config.checkpoint.folder;
  s.engine->set_trace_folder(s.run_folder / config.comm.save_traces_folder);
  s.engine->set_trace_buffer(size_t(config.comm.trace_buf_size));
  s.engine->set_timeout(double(config.comm.init_timeout_seconds));
  const Parallelism& par = config.parallelism;
  const auto degrees = distributed::resolve_mesh({par.pipeline_parallel_degree, par.data_parallel_replicate_degree,
                                                  par.data_parallel_shard_degree, par.context_parallel_degree,
                                                  par.tensor_parallel_degree},
                                                 s.world->size(), source);
  const bool expert_tp = par.experts_split_over_tp();
  distributed::check_expert_degree(degrees, par.expert_parallel_degree, source, expert_tp);
  s.mesh = std::make_unique<distributed::DeviceMesh>(*s.world, degrees, int(par.expert_parallel_degree), expert_tp);
  fs::create_directories(s.run_folder);
  if (s.lead) std::ofstream(s.run_folder / "config.toml") << to_toml(config);
  if (s.lead && config.job.print_config)
    std::printf("the resolved configuration (also in %s):\n%s\n", (s.run_folder / "config.toml").c_str(),
                to_toml(config).c_str());

  const Training& t = config.training;
  data::DataLoaderOptions lo;
  lo.dir = (fs::path(t.dataset_path) / "train").string();
  lo.seq_len = int(t.seq_len);
  lo.seed = uint64_t(config.debug.seed);
  lo.rank = s.mesh->dp().rank();
  lo.world_size = s.mesh->dp().size();
  s.train_loader = std::make_unique<data::DataLoader>(lo);
  if (config.validation.enable) {
    data::DataLoaderOptions vo = lo;
    const std::string vp = config.validation.dataset_path.empty() ? t.dataset_path : config.validation.dataset_path;
    vo.dir = (fs::path(vp) / "val").string();
    vo.seq_len = int(config.validation.seq_len);
    vo.shuffle = false;
    vo.repeat = false;
    s.val_loader = std::make_unique<data::DataLoader>(vo);
  }

  int64_t vocab = s.train_loader->vocab_size();
  if (const std::string tf = tokenizer_file(config); !tf.empty()) {
    const data::Tokenizer tok = data::Tokenizer::load(tf);
    TITAN_CHECK(tok.vocab_size() == vocab, source + ": the tokenizer " + tf + " has " + std::to_string(tok.vocab_size()) +
                                               " tokens but the dataset " + t.dataset_path + " was prepared with " +
                                               std::to_string(vocab),
                "re-run `titan data prepare` with this tokenizer, or point model.tokenizer_path at the one it used");
  }
  // A checkpoint converted from Hugging Face (`titan ckpt convert --from-hf`) records its
  // architecture, which then replaces the flavor's; the run's own checkpoints record it again.
  s.initial_load = config.checkpoint.initial_load_path;
  if (config.checkpoint.enable && config.checkpoint.initial_load_in_hf && !s.initial_load.empty())
    s.initial_load = s.from_rank0([&] { return s.import_hf(config.checkpoint.initial_load_path).string(); });
  if (config.checkpoint.enable && !s.initial_load.empty())
    s.hf_config = checkpoint::load_train_state(s.initial_load).value("hf_config", json());
  ProfileScope building("model build");  // the site of the parameters in memory snapshots
  std::optional<PipelinePlan> pipeline_plan;
  models::ModelOptions options = model_options(config, s.hf_config.is_null() ? nullptr : &s.hf_config, *s.mesh);
  if (s.mesh->degree(distributed::MeshDim::pp) > 1) {  // its errors name the source
    const int64_t n_layers = models::model_layers(config.model.name, config.model.flavor, vocab, options);
    pipeline_plan = plan_pipeline(config, n_layers, s.mesh->coordinate(distributed::MeshDim::pp), source);
    options.pipeline_stages = pipeline_plan->mine;
  }
  try {
    s.model = models::build_model(config.model.name, config.model.flavor, vocab, t.seq_len, options);
  } catch (const Error& e) {
    TITAN_FAIL(source + ": " + e.message(), e.hint());
  }
  if (s.lead && !s.hf_config.is_null())
    std::printf("architecture from the Hugging Face config recorded in %s (model.flavor is not used)\n",
                s.initial_load.c_str());
  if (s.lead && options.quantize.any()) std::printf("%s", models::describe_quantized(*s.model).c_str());
  s.model->set_compute_dtype(t.mixed_precision_param);
  s.model->set_recompute(config.activation_checkpoint.mode);
  s.dp = make_data_parallel(*s.model, *s.mesh, config, source, pipeline_plan ? &*pipeline_plan : nullptr);
  {
    ProfileScope state("optimizer state");
    std::optional<optim::Swap> swap;
    if (config.optimizer.swap == OptimizerSwap::file)
      swap = optim::Swap{(s.run_folder / config.optimizer.swap_path /
                          ("optimizer.rank" + std::to_string(s.world->rank()) + ".swap")).string(),
                         config.optimizer.swap_chunk_mb << 20};
    s.opt = make_optimizer(config, *s.model, s.dp->params(), *s.mesh, swap, s.lead, source);
  }
  s.accum = gradient_accumulation_steps(config, s.dp_degree());
  if (pipeline_plan) {
    const distributed::ProcessGroup& pp = s.mesh->group(distributed::MeshDim::pp);
    s.pipeline = std::make_unique<PipelineStep>(std::move(*pipeline_plan), *s.model, pp,
                                                config.parallelism.pipeline_parallel_microbatch_size, t.seq_len,
                                                s.model->activation_dtype(),
                                                config.parallelism.pipeline_parallel_expert_parallel_overlap &&
                                                    config.parallelism.expert_parallel_degree > 1,
                                                config.parallelism.pipeline_tree_sum(),
                                                dynamic_cast<distributed::Fsdp*>(s.dp.get()));
    // Checkpoints hold every stage's tensors: those of the other pipeline ranks are not "extra".
    s.other_stages = names_on_other_stages(*s.model, pp);
  }
  s.inputs = Tensor::empty({t.local_batch_size, t.seq_len}, DType::i32, MemCategory::activations);
  s.targets = Tensor::empty({t.local_batch_size * t.seq_len}, DType::i32, MemCategory::activations);
  if (s.lead && s.world->size() > 1) {
    using distributed::MeshDim;
    std::string layout = s.dp->describe();
    if (const int tp = s.mesh->degree(MeshDim::tp); tp > 1)
      layout += "; tensor parallel over " + std::to_string(tp) + " ranks (sequence-parallel norms, loss parallel)";
    if (const int cp = s.mesh->degree(MeshDim::cp); cp > 1)
      layout += "; context parallel over " + std::to_string(cp) + " ranks (" + std::to_string(2 * cp) +
                " head-tail chunks per sequence)";
    if (const int ep = s.mesh->ep().size(); ep > 1)
      layout += "; expert parallel over " + std::to_string(ep) + " ranks (routed experts by all-to-all" +
                (par.experts_split_over_tp() && s.mesh->degree(MeshDim::tp) > 1
                     ? ", each expert's hidden units over TP)"
                     : ")");
    if (s.pipeline) {
      const distributed::pp::Schedule& sc = s.pipeline->executor().schedule();
      layout += "; pipeline parallel over " + std::to_string(sc.ranks) + " ranks (" + sc.name + ", " +
                std::to_string(sc.stages()) + " stages, " + std::to_string(sc.microbatches) + " micro-batches" +
                (s.pipeline->executor().runs_compute_pairs() ? ", F&B pairs taking turns at expert all-to-alls" : "") +
                ", gradients summed " + (config.parallelism.pipeline_tree_sum() ? "as a tree" : "in place") +
                (s.mesh->fsdp().size() > 1 ? config.parallelism.pipeline_parallel_fsdp == PipelineFsdp::zero3
                                                 ? ", FSDP reduce-scattering each micro-batch (ZeRO-3)"
                                                 : ", FSDP reduce-scattering once per step"
                                           : "") +
                ")";
    }
    std::printf("%d ranks: mesh %s; %s\n", s.world->size(), s.mesh->str().c_str(), layout.c_str());
  }

  if (config.checkpoint.enable && config.checkpoint.async_mode == CheckpointAsyncMode::async)
    s.saver = std::make_unique<checkpoint::AsyncSaver>(*s.world, double(config.comm.init_timeout_seconds),
                                                       config.checkpoint.staging_mib << 20);
  // Resume: the newest usable checkpoint of this run (or the step asked for), else the configured
  // initial weights.
  if (config.checkpoint.enable) {
    // What failed saves and damaged checkpoints left (a crash loop could fill the disk), before
    // this run saves anything.
    // Housekeeping: a folder that cannot go now (a file an old process holds open on NFS) goes at
    // a later start, and never stops this one.
    if (s.lead) {
      try {
        const auto removed = checkpoint::purge_abandoned(s.checkpoint_root, kAbandonedKept);
        for (const fs::path& p : removed)
          std::printf("removed %s, left by a save that never committed or set aside as damaged (the newest %d of "
                      "each kind are kept)\n", p.string().c_str(), kAbandonedKept);
      } catch (const std::exception& e) {
        std::printf("warning: abandoned checkpoint folders stay for now: %s\n", e.what());
      }
    }
    std::optional<fs::path> from;
    if (config.checkpoint.load_at_most >= 0) {  // (`titan launch` restarting a run that pinned load_step)
      from = s.resume_from_latest(config.checkpoint.load_at_most);
    } else if (config.checkpoint.load_step >= 0) {
      from = checkpoint::step_folder(s.checkpoint_root, config.checkpoint.load_step);
      TITAN_CHECK(!is_weights_only(*from),
                  source + ": checkpoint.load_step = " + std::to_string(config.checkpoint.load_step) + " names " +
                      from->string() + ", which holds the weights alone (a model-only save): no optimizer or data state "
                      "to resume",
                  "to start a run from these weights, set checkpoint.initial_load_path = \"" + from->string() +
                      "\" and checkpoint.initial_load_model_only = true instead");
      s.restore(*from, false);
    } else {
      from = s.resume_from_latest();
    }
    if (from) {
      if (s.lead) std::printf("resumed from %s (step %lld)\n", from->string().c_str(), static_cast<long long>(s.step));
    } else if (!s.initial_load.empty()) {
      s.restore(s.initial_load, config.checkpoint.initial_load_model_only);
      if (s.lead) std::printf("initialized from %s\n", s.initial_load.c_str());
    }
  }
}

Trainer::~Trainer() = default;

models::CausalLM& Trainer::model() { return *s_->model; }
const optim::Optimizer& Trainer::optimizer() const { return *s_->opt; }
const distributed::pp::PipelineExecutor* Trainer::pipeline_executor() const {
  return s_->pipeline ? &s_->pipeline->executor() : nullptr;
}

void Trainer::State::restore(const fs::path& folder, bool model_only) {
  if (saver) saver->wait_staged();  // the load overwrites what a save in flight may still be reading
  const json train_state = load_run_checkpoint(folder, parts(), cfg, model_only);
  if (model_only) return;
  data::DataLoaderState data;
  try {  // what every save writes, damaged (a data position of another dataset is not damage)
    step = train_state.at("step").get<int64_t>();
    data = train_state.at("data").get<data::DataLoaderState>();
    // A checkpoint of a run without loss scaling resumes at loss_scale_init.
    if (scaler && train_state.contains("loss_scaler")) scaler->load(train_state.at("loss_scaler"));
  } catch (const json::exception& e) {
    throw checkpoint::CorruptCheckpoint((folder / "train_state.json").string() + ": " + e.what(),
                                        "the checkpoint is damaged; load an earlier step", __FILE__, __LINE__);
  } catch (const Error& e) {
    throw checkpoint::CorruptCheckpoint((folder / "train_state.json").string() + ": " + e.message(),
                                        "the checkpoint is damaged; load an earlier step", __FILE__, __LINE__);
  }
  train_loader->restore(data);
}

void Trainer::State::save(bool final_save) {
  ProfileScope span("checkpoint");
  const bool model_only = final_save && cfg.checkpoint.last_save_model_only;
  const DType export_dtype = cfg.checkpoint.export_dtype;
  json train_state = json::object();
  if (!model_only)
    train_state = {{"step", step}, {"data", train_loader->state()}, {"seed", cfg.debug.seed}, {"optimizer", opt->name()}};
  if (!model_only && scaler) train_state["loss_scaler"] = scaler->state();
  if (!hf_config.is_null()) train_state["hf_config"] = hf_config;  // for generate and convert --to-hf
  const checkpoint::SaveRequest request = run_checkpoint_request(step, parts(), cfg, train_state, model_only, export_dtype);
  // A rank still writing its file (or rank 0 merging the metadata and purging old steps) can keep
  // the others waiting in the save's collectives far longer than a step: the long deadline.
  engine->set_timeout(double(cfg.comm.init_timeout_seconds));
  if (saver && !final_save) {  // staged now, written in the background, committed by a later poll
    std::optional<fs::path> previous;
    saver->start(checkpoint_root, request, &previous);
    if (previous) on_committed(*previous);
    if (lead)
      std::printf("checkpoint step %lld staged in %.3f s, writing in the background\n", static_cast<long long>(step),
                  saver->staging_seconds());
  } else {
    if (saver)
      if (const auto previous = saver->finish()) on_committed(*previous);
    const fs::path saved = checkpoint::save_checkpoint(checkpoint_root, request, world, cfg.checkpoint.staging_mib << 20);
    on_committed(saved, model_only);
    if (final_save && cfg.checkpoint.last_save_in_hf) from_rank0([&] { return export_hf(saved), std::string(); });
    world->barrier().wait();  // the purge done before anyone moves on under the short deadline
  }
  engine->set_timeout(double(cfg.comm.timeout_seconds));
}

fs::path Trainer::State::import_hf(const fs::path& hf_dir) {
  const fs::path root = run_folder / "hf_import", done = checkpoint::step_folder(root, 0);
  const fs::path folder = fs::absolute(hf_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(done / "metadata.json", ec) &&
      checkpoint::load_train_state(done).value("converted_from", std::string()) == folder.string()) {
    std::printf("checkpoint.initial_load_in_hf: %s, converted before\n", done.c_str());
    return done;
  }
  const HfImported imported = import_hf_folder(folder, root, 0);
  TITAN_CHECK(imported.model == cfg.model.name,
              "checkpoint.initial_load_path " + folder.string() + " holds a " + imported.model + " model, but model.name = " +
                  cfg.model.name,
              "set model.name = \"" + imported.model + "\"");
  if (!imported.note.empty()) std::printf("%s\n", imported.note.c_str());
  std::printf("checkpoint.initial_load_in_hf: converted %s into %s (%zu tensors)\n", folder.c_str(),
              imported.folder.c_str(), imported.tensors);
  return imported.folder;
}

void Trainer::State::export_hf(const fs::path& saved) {
  const fs::path dir = saved.parent_path() / (saved.filename().string() + "-hf");
  checkpoint::HfWriteOptions options;
  options.dtype = cfg.checkpoint.export_dtype;
  const size_t written = export_hf_folder(saved, dir, cfg.model.flavor, options);
  std::printf("checkpoint.last_save_in_hf: wrote %s (%zu tensors, %s)\n", dir.c_str(), written,
              std::string(name_of(options.dtype)).c_str());
}

void Trainer::State::on_committed(const fs::path& dir, bool model_only) {
  if (!lead) return;
  if (!model_only) committed_step = std::stoll(dir.filename().string().substr(5));  // "step-<N>"
  checkpoint::keep_latest(checkpoint_root, int(cfg.checkpoint.keep_latest_k));
  std::printf("checkpoint saved: %s%s\n", dir.string().c_str(), model_only ? " (model only)" : "");
}

std::string Trainer::State::from_rank0(const std::function<std::string()>& answer) {
  std::string text;
  if (lead) {
    try {
      text = "+" + answer();
    } catch (const std::exception& e) {
      text = "!" + std::string(e.what());
    }
  }
  if (world->size() > 1) text = world->all_gather(text)[0];
  if (text[0] == '!') TITAN_FAIL(text.substr(1));
  return text.substr(1);
}

std::optional<fs::path> Trainer::State::resume_from_latest(int64_t at_most) {
  std::string set_aside;  // the damaged checkpoints, each with what was wrong with it
  while (true) {
    const std::string chosen = from_rank0([&] {
      std::vector<fs::path> weights_only;
      const auto full = newest_full_checkpoint(checkpoint_root, at_most, &weights_only);
      const std::string export_name = weights_only.empty() ? "" : weights_only.front().string();
      // Damaged checkpoints set aside are the first thing to say (below); then a lone export.
      TITAN_CHECK(full || weights_only.empty() || !set_aside.empty(),
                  "no checkpoint to resume from in " + checkpoint_root.string() + ": " + export_name +
                      " holds the weights alone (the final save of checkpoint.last_save_model_only = true), without "
                      "the optimizer and data state",
                  "to train on from those weights, set checkpoint.initial_load_path = \"" + export_name +
                      "\" and checkpoint.initial_load_model_only = true with another job.dump_folder; to start over, "
                      "remove " + checkpoint_root.string());
      if (full && !weights_only.empty())
        std::printf("%s holds the weights alone (a model-only final save); resuming from %s, the newest checkpoint with "
                    "the optimizer and data state\n", export_name.c_str(), full->filename().string().c_str());
      return full ? full->string() : std::string();
    });
    if (chosen.empty()) break;
    const fs::path from = chosen;
    // Every rank reads its own pieces: rank 0 judges all their outcomes.
    const std::string outcome = load_outcome([&] { restore(from, false); });
    const std::vector<std::string> outcomes = world->size() > 1 ? world->all_gather(outcome) : std::vector{outcome};
    // A file some rank could not find is lost only when no rank sees it (rank 0's own view may be
    // the stale one): every rank looks.
    std::vector<std::string> missing;
    for (const std::string& o : outcomes)
      if (o.starts_with("M")) missing.push_back(o.substr(1, o.find('\n') - 1));
    std::string seen;
    for (const std::string& f : missing) seen += fs::exists(f) ? '1' : '0';
    const std::vector<std::string> views = world->size() > 1 ? world->all_gather(seen) : std::vector{seen};
    const auto seen_by_some_rank = [&](const fs::path& file) {
      for (size_t i = 0; i < missing.size(); ++i)
        if (missing[i] == file.string())
          for (const std::string& v : views)
            if (v[i] == '1') return true;
      return false;
    };
    const std::string verdict = from_rank0([&] {
      const LoadVerdict v = judge_load(from, outcomes, seen_by_some_rank);
      if (v.kind == LoadVerdict::Kind::damaged) {  // set aside here, so that a failure is every rank's
        const fs::path aside = from.string() + ".corrupt";
        std::error_code ec;
        fs::remove_all(aside, ec);
        if (!ec) fs::rename(from, aside, ec);
        if (ec)
          throw IOError("cannot set the damaged checkpoint " + from.string() + " aside: " + ec.message(),
                        "check the folder's permissions, or move it away by hand", __FILE__, __LINE__);
        std::printf("checkpoint %s is damaged, set aside as %s; trying the one before it:%s\n", from.string().c_str(),
                    aside.filename().string().c_str(), v.report.c_str());
      }
      return std::string(1, "ldf"[int(v.kind)]) + v.report;
    });
    if (verdict[0] == 'l') return from;
    TITAN_CHECK(verdict[0] == 'd', verdict.substr(1),
                "fix what the message names and rerun the same command (`titan launch` retries by itself)");
    set_aside += "\n  " + from.filename().string() + ":" + verdict.substr(1);
  }
  // Loading a damaged checkpoint changed some state on some ranks: a fresh start needs a fresh process.
  TITAN_CHECK(set_aside.empty(), "no usable checkpoint is left in " + checkpoint_root.string() +
                                     "; these were damaged and set aside (*.corrupt):" + set_aside,
              "run the same command again to start from step 0 (`titan launch` does so itself), or put back a good copy");
  return std::nullopt;
}

void Trainer::State::roll_back(int64_t bad_step, MetricsLogger& log) {
  const std::string hint =
      "set checkpoint.enable = true with a checkpoint.interval below the step, or fault.on_nonfinite = \"skip\"";
  TITAN_CHECK(cfg.checkpoint.enable, "step " + std::to_string(bad_step) + " was not finite and fault.on_nonfinite = "
                                         "\"rollback\", but checkpoints are off: no committed checkpoint to return to", hint);
  // Waiting for the slowest rank's write and reading the checkpoint back: the long deadline.
  engine->set_timeout(double(cfg.comm.init_timeout_seconds));
  if (saver)
    if (const auto previous = saver->finish()) on_committed(*previous);
  world->barrier().wait();  // rank 0's commit is visible before anyone looks for the newest
  // The newest full checkpoint before the bad step (a later one may be left from another attempt),
  // as rank 0 sees it.
  const std::string chosen = from_rank0([&] {
    const auto full = newest_full_checkpoint(checkpoint_root, bad_step - 1);
    return full ? full->string() : std::string();
  });
  const std::optional<fs::path> from = chosen.empty() ? std::nullopt : std::optional<fs::path>(chosen);
  TITAN_CHECK(from.has_value(), "step " + std::to_string(bad_step) + " was not finite and fault.on_nonfinite = \"rollback\", "
                                    "but " + checkpoint_root.string() + " holds no committed checkpoint to return to", hint);
  // As a fresh process would: MoE token counts start from zero (the frozen steps' ones load).
  for (const nn::BufferKind kind : {nn::BufferKind::step_statistic, nn::BufferKind::saved_statistic})
    for (auto& [name, b] : model->named_buffers(kind)) b.zero_();
  skipped_steps.insert(bad_step);
  restore(*from, false);
  engine->set_timeout(double(cfg.comm.timeout_seconds));
  log.log_event("rolled back to " + from->string() + " (step " + std::to_string(step) + "); step " +
                std::to_string(bad_step) + "'s batch will be skipped");
}

std::string Trainer::State::nonfinite(bool local_bad, double loss, double norm, const std::string& where) {
  double flag = local_bad ? 1 : 0;
  if (world->size() > 1) world->all_reduce(std::span<double>(&flag, 1), distributed::ReduceOp::max);
  if (flag == 0) return {};
  std::vector<std::string> all = world->size() > 1 ? world->all_gather(local_bad ? where : std::string())
                                                   : std::vector<std::string>{where};
  std::string ranks;
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) ranks += (ranks.empty() ? "rank " : ", rank ") + std::to_string(r) + " (" + all[r] + ")";
  char values[96];
  std::snprintf(values, sizeof values, "loss %g, gradient norm %g", loss, norm);
  return "step " + std::to_string(step) + " is not finite (" + values + ") on " + ranks;
}

void Trainer::State::inject_fault() {
  const Fault& f = cfg.fault;
  if (f.inject_step_delay_seconds > 0 && world->rank() == f.inject_rank)
    std::this_thread::sleep_for(std::chrono::duration<double>(f.inject_step_delay_seconds));
  const char* restart = std::getenv("TITAN_RESTART");  // set by `titan launch`: a restart replays no injection
  if (f.inject_nonfinite_at_step != step + 1 || world->rank() != f.inject_rank || (restart && std::string(restart) != "0"))
    return;
  for (const nn::TrainableParam& p : dp->params())
    if (p.var.grad().defined() && p.var.grad().numel() > 0) {
      p.var.grad().data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      return;
    }
}

void Trainer::State::write_trace(MetricsLogger& log) {
  const fs::path file = profile_file(cfg.profiling.save_traces_folder, "_trace.json");
  write_chrome_trace(file, trace_stop(), world->rank(), "rank " + std::to_string(world->rank()));
  log.log_event("trace of step " + std::to_string(step) + ": " + file.string() + " (open in ui.perfetto.dev)");
}

void Trainer::State::write_memory_snapshot(MetricsLogger& log) {
  const MemorySnapshot snap = memory_snapshot_take();
  json by_category = json::object(), blocks = json::array();
  std::map<std::string, int64_t> by_site;
  for (const MemoryBlock& b : snap.blocks) {
    const std::string cat(mem_category_name(b.category));
    by_category[cat] = by_category.value(cat, int64_t(0)) + b.bytes;
    by_site[cat + " / " + (b.site.empty() ? "(outside any op)" : b.site)] += b.bytes;
    blocks.push_back({{"bytes", b.bytes}, {"category", cat}, {"site", b.site}});
  }
  json sites = json::array();
  for (const auto& [site, bytes] : by_site) sites.push_back({{"site", site}, {"bytes", bytes}});
  const fs::path file = profile_file(cfg.profiling.save_memory_snapshot_folder, "_memory_snapshot.json");
  fs::create_directories(file.parent_path());
  std::ofstream(file) << json{{"step", step},
                              {"rank", world->rank()},
                              {"peak_bytes", snap.peak_total},
                              {"by_category", by_category},
                              {"by_site", sites},
                              {"blocks", blocks}}
                             .dump(1);
  std::string chart;
  if (cfg.metrics.enable_plots) {
    try {  // a chart that cannot be drawn does not end the run
      chart = ", chart " + plot_memory_snapshot(file).filename().string();
    } catch (const std::exception& e) {
      chart = " (no chart: " + std::string(e.what()) + ")";
    }
  }
  log.log_event("memory at the peak of step " + std::to_string(step) + " (" + format_bytes(double(snap.peak_total)) +
                "): " + file.string() + chart);
}

// The run's plots: a finished training is not failed by a plot that could not be drawn.
void Trainer::State::draw_plots(MetricsLogger& log) const {
  const fs::path folder = run_folder / "plots";
  try {
    std::string names;
    for (const fs::path& png : write_run_plots(run_folder / cfg.metrics.jsonl_file, folder))
      names += (names.empty() ? "" : ", ") + png.filename().string();
    log.log_event("plots: " + names + " in " + folder.string());
  } catch (const std::exception& e) {
    log.log_event(std::string("plots not drawn: ") + e.what());
  }
}

void Trainer::State::mean_over_data(std::vector<double>& values) {
  mesh->loss().all_reduce(std::span<double>(values));
  for (double& v : values) v /= double(mesh->loss().size());
}

double Trainer::State::validate() {
  ProfileScope span("validation");
  autograd::NoGradGuard no_grad;
  val_loader->reset();
  const int64_t b = cfg.validation.local_batch_size, sl = cfg.validation.seq_len;
  Tensor in = Tensor::empty({b, sl}, DType::i32, MemCategory::activations);
  Tensor tg = Tensor::empty({b * sl}, DType::i32, MemCategory::activations);
  double total = 0;
  int64_t batches = 0;
  while (cfg.validation.steps < 0 || batches < cfg.validation.steps) {
    if (!val_loader->next_batch(in.data<int32_t>(), tg.data<int32_t>(), int(b), int(sl))) break;
    dp->begin_forward(false);
    total += pipeline ? pipeline->evaluate(in, tg) : model->evaluation_loss(in, tg);
    dp->finish_forward();
    ++batches;
  }
  TITAN_CHECK(batches > 0, "validation: the validation set has fewer than one batch of " + std::to_string(b) + " x " +
                               std::to_string(sl) + " tokens per data-parallel rank",
              "lower validation.local_batch_size or validation.seq_len, or prepare a larger validation split");
  std::vector<double> mean = {total / double(batches)};
  mean_over_data(mean);  // every rank ran the same number of batches (the loader splits whole global batches)
  return mean[0];
}

StepOutcome Trainer::State::train_step(MetricsLogger& log) {
  const Training& t = cfg.training;
  if (const std::string event = model->begin_step(step + 1); !event.empty()) log.log_event(event);
  dp->zero_grad();
  // Quantized weights (autograd/quantized_linear.h) are recomputed once per step: a checkpoint
  // reload or rollback since the last step also lands here.
  autograd::note_parameters_changed();
  StepOutcome out;
  // Gradients are reduced by summing over the data-parallel ranks, so each rank's backward is
  // seeded with 1 / (micro-batches x ranks): the sum is the mean over the global batch. Under loss
  // scaling the seed is multiplied by the scale (the scaled loss's backward).
  const double seed = loss_scale() / double(accum * dp_degree());
  const Tensor dloss = Tensor::full({1}, seed, DType::f32);
  if (pipeline) dp->begin_forward(/*sync_gradients=*/true);  // one pass of the schedule's micro-batches per accumulation step
  for (int64_t micro = 0; micro < accum; ++micro) {
    const double d0 = train_loader->seconds_spent();
    {
      ProfileScope span("data loading");
      if (pipeline && pipeline->interleaves_data()) {
        // FSDP reduces each micro-batch over the data-parallel ranks (fsdp.h's zero3): micro-batch m
        // of rank r is the global batch's (m x ranks + r)-th, so that the sum over ranks, then over
        // micro-batches, is one rank's binary tree over the batch in order (tree_sum.h).
        const int64_t mb = pipeline->microbatch_size();
        for (int64_t m = 0; m < t.local_batch_size / mb; ++m)
          train_loader->next_batch(inputs.data<int32_t>() + m * mb * t.seq_len, targets.data<int32_t>() + m * mb * t.seq_len,
                                   int(mb), int(t.seq_len));
      } else {
        train_loader->next_batch(inputs.data<int32_t>(), targets.data<int32_t>(), int(t.local_batch_size), int(t.seq_len));
      }
    }
    out.data_seconds += train_loader->seconds_spent() - d0;
    models::TrainingLoss loss;
    if (pipeline) {  // the batch's micro-batches through the schedule, forward and backward
      const PipelineLosses l = pipeline->run(inputs, targets, seed);
      loss.cross_entropy = l.cross_entropy;
      loss.terms.assign(l.terms.begin(), l.terms.end());
    } else {
      dp->begin_forward(/*sync_gradients=*/micro + 1 == accum);
      loss = [&] {
        ProfileScope span("forward");
        return model->training_loss(inputs, targets);
      }();
      ProfileScope span("backward");
      autograd::backward(loss.total, dloss);
    }
    out.loss += loss.cross_entropy / double(accum);
    for (const auto& [name, v] : loss.terms) out.terms[name] += v / double(accum);
  }
  if (pipeline) pipeline->finish_step();
  {
    ProfileScope span("gradient reduction");
    dp->finish_backward();
    distributed::sum_partial_gradients(dp->params(), mesh->group(distributed::MeshDim::tp));
  }
  inject_fault();
  ProfileScope optimizer_span("optimizer");
  const double local_loss = out.loss;
  // The step's losses, the means over all data-parallel ranks.
  std::vector<double> scalars = {out.loss};
  for (const auto& [name, v] : out.terms) scalars.push_back(v);
  mean_over_data(scalars);
  out.loss = scalars[0];
  size_t k = 1;
  for (auto& [name, v] : out.terms) v = scalars[k++];
  // Squares summed over the ranks holding distinct pieces: the FSDP shards, then the TP shards.
  auto norm = optim::clip_grad_norm(dp->params(), t.max_norm, [this](double x) {
    double sum = dp->sum_over_shards(x);
    for (distributed::MeshDim d : {distributed::MeshDim::tp, distributed::MeshDim::pp})
      if (const distributed::ProcessGroup& g = mesh->group(d); g.size() > 1) g.all_reduce(std::span<double>(&sum, 1));
    return sum;
  });
  if (scaler) unscale(norm, t.max_norm);
  out.grad_norm = norm.norm;
  ++step;
  out.lr = cfg.optimizer.lr * schedule.lr_factor(step);
  // A non-finite loss or gradient on any rank: every rank knows before any update (fault.on_nonfinite).
  const std::string where = !std::isfinite(local_loss) ? "its loss" : norm.nonfinite.empty() ? "" : "the gradient of " + norm.nonfinite;
  out.fault = nonfinite(!where.empty(), out.loss, out.grad_norm, where);
  // Under loss scaling an overflow skips the step and backs the scale off; one at the minimum
  // scale is a real divergence, which the fault policy below handles.
  if (!out.fault.empty() && scaler && !scaler->at_minimum()) {
    const double was = scaler->scale();
    scaler->update(/*overflow=*/true);
    char text[128];
    std::snprintf(text, sizeof text, "; update skipped, loss scale %g -> %g (%lld skipped so far)", was, scaler->scale(),
                  static_cast<long long>(scaler->skipped_steps()));
    out.fault += text;
    out.skipped = out.overflow = true;
    discard_step_counts();
    return out;
  }
  if (!out.fault.empty()) {
    switch (cfg.fault.on_nonfinite) {
      case NonFinitePolicy::abort:
        TITAN_FAIL("training diverged: " + out.fault,
                   "lower optimizer.lr or raise lr_scheduler.warmup_steps and resume from the last checkpoint; or set "
                   "fault.on_nonfinite = \"skip\" (drop the step's update) or \"rollback\" (reload the last "
                   "checkpoint, skipping the step's batch)");
      case NonFinitePolicy::rollback:  // once per step: a step rolled back before is skipped this time
        out.rollback = !skipped_steps.count(step);
        break;
      case NonFinitePolicy::skip: break;
    }
    out.skipped = !out.rollback;
    if (out.skipped) discard_step_counts();
    return out;
  }
  if (skipped_steps.count(step)) {  // the batch a rollback skips: its step counts, its update does not
    out.skipped = true;
    out.fault = "step " + std::to_string(step) + " skipped: its batch was not finite before the rollback";
    discard_step_counts();
    return out;
  }
  if (saver) saver->wait_staged();  // a save in flight still reading the weights or the optimizer state
  if (scaler) scaler->update(/*overflow=*/false);
  opt->step(float(out.lr), norm.scale);
  autograd::note_parameters_changed();  // validation after this step sees the new weights
  // MoE's expert loads: summed over the data (and context) ranks, and under the MoE TP fix over
  // TP, whose ranks route their own sequence pieces (under the gather scheme every TP rank counts
  // the same gathered tokens: one rank's count is the group's).
  model->end_step([this](Tensor& x) {
    mesh->loss().all_reduce(x).wait();
    const distributed::ProcessGroup& tp = mesh->group(distributed::MeshDim::tp);
    if (tp.size() > 1 && !cfg.parallelism.experts_split_over_tp()) tp.all_reduce(x).wait();
  });
  return out;
}

TrainResult Trainer::train() {
  State& s = *s_;
  const JobConfig& c = s.cfg;
  const Training& t = c.training;
  MetricsLogger log(metrics_options(c, s.run_folder, s.world->rank()));
  const StablePeak stable = stable_machine_peak(0.2);
  const bool bf16 = s.model->compute_dtype() == DType::bf16;
  const double peak_flops = bf16 ? stable.peak.bf16_flops : stable.peak.f32_flops;
  const int64_t dp = s.dp_degree();
  std::vector<double> parameters = {double(global_parameters(*s.model))};
  if (const distributed::ProcessGroup& pp = s.mesh->group(distributed::MeshDim::pp); pp.size() > 1)
    pp.all_reduce(std::span<double>(parameters));  // each pipeline rank holds its stages' parameters
  if (s.lead) {
    std::printf("model %s/%s: %.2fM parameters, %s compute, %lld steps of %lld x %lld tokens x %lld data-parallel "
                "ranks (x%lld accumulation)\n",
                c.model.name.c_str(), c.model.flavor.c_str(), parameters[0] / 1e6,
                s.model->compute_dtype() == DType::bf16   ? "bf16"
                : s.model->compute_dtype() == DType::f16 ? "fp16 (f16-rounded GEMMs, f32 accumulation)"
                                                         : "f32",
                static_cast<long long>(t.steps),
                static_cast<long long>(t.local_batch_size), static_cast<long long>(t.seq_len),
                static_cast<long long>(dp), static_cast<long long>(s.accum));
    std::printf("unigram entropy of the training corpus: %.3f nats/token (the loss of a model that ignores context)\n",
                s.train_loader->unigram_entropy());
    std::printf("%s\n", stable.describe(bf16).c_str());
    if (s.scaler)
      std::printf("dynamic loss scaling: scale %g, x%g after %lld finite steps, x%g at an overflow (minimum %g); "
                  "gradients reduced in %s\n",
                  s.scaler->scale(), t.loss_scale_growth_factor, static_cast<long long>(t.loss_scale_growth_interval),
                  t.loss_scale_backoff_factor, t.loss_scale_min, std::string(dtype_name(t.gradient_sync_dtype)).c_str());
  }
  // Ctrl-C, or SIGUSR1 (stop_request.h): save a checkpoint and stop. `titan train` listens from its
  // start; a request that came during start-up is honoured here, before the first step.
  const StopScope listening;
  TrainResult result;
  result.run_folder = s.run_folder;
  const double start_time = steady_seconds();
  const int64_t first_step = s.step;
  MetricsWindow window(*s.world, *s.engine,
                       {.tokens_per_step = double(s.accum * t.local_batch_size * t.seq_len),
                        .pipeline_share = 1.0 / s.mesh->degree(distributed::MeshDim::pp),
                        .dp = dp,
                        .peak_flops = peak_flops});
  if (s.step < t.steps && s.any_rank_stopped()) {  // nothing trained since the start or the checkpoint resumed
    result.interrupted = true;
    result.last_step = s.step;
    log.log_event("stop requested during start-up, before step " + std::to_string(s.step + 1) +
                  ": nothing to save; rerun the same command to " + (s.step > 0 ? "resume" : "start"));
  }
  while (s.step < t.steps && !result.interrupted) {
    const double t0 = steady_seconds();
    memory_reset_peak();
    const bool profiled = (s.step + 1) % c.profiling.profile_freq == 0;
    if (profiled && c.profiling.enable_profiling) trace_start();
    if (profiled && c.profiling.enable_memory_snapshot) memory_snapshot_start();
    const StepOutcome o = s.train_step(log);
    if (o.rollback) {
      log.log_event(o.fault);
      s.roll_back(s.step, log);
      continue;
    }
    if (o.overflow) log.log_event(o.fault);
    else if (o.skipped) log.log_event(o.fault + "; its update skipped (fault.on_nonfinite = \"" + std::string(name_of(c.fault.on_nonfinite)) + "\")");
    if (s.saver)  // an asynchronous save whose files every rank has written is committed
      if (const auto dir = s.saver->poll()) s.on_committed(*dir);
    if (profiled && c.profiling.enable_memory_snapshot) s.write_memory_snapshot(log);
    if (s.step == first_step + 1) {  // start-up is over: every rank lowers the deadline together
      s.world->barrier().wait();
      s.engine->set_timeout(double(c.comm.timeout_seconds));
    }
    const double step_seconds = steady_seconds() - t0;
    result.last_step = s.step;
    result.last_loss = o.loss;
    window.add_step(o.data_seconds, s.model->training_flops_per_token(t.seq_len));

    if (s.step % c.metrics.log_freq == 0 || s.step == t.steps || s.step == first_step + 1) {
      StepMetrics m;
      m.step = s.step;
      m.total_steps = t.steps;
      m.loss = o.loss;
      m.grad_norm = o.grad_norm;
      m.lr = o.lr;
      m.step_seconds = step_seconds;
      m.eta_seconds = (steady_seconds() - start_time) / double(s.step - first_step) * double(t.steps - s.step);
      if (const std::string straggler = window.close(m); !straggler.empty()) log.log_event(straggler);
      for (const auto& [k, v] : o.terms) m.summary.emplace_back(k, v);
      if (s.scaler) {
        m.summary.emplace_back("loss_scale", s.scaler->scale());
        m.summary.emplace_back("skipped_steps", double(s.scaler->skipped_steps()));
      }
      const models::StepStats stats = s.model->step_stats();
      m.summary.insert(m.summary.end(), stats.summary.begin(), stats.summary.end());
      m.detail.insert(m.detail.end(), stats.detail.begin(), stats.detail.end());
      log.log_step(m);
    }
    if (s.val_loader && (s.step % c.validation.freq == 0 || s.step == t.steps)) {
      result.last_val_loss = s.validate();
      log.log_validation(s.step, result.last_val_loss, std::exp(result.last_val_loss));
    }
    if (on_step_end) on_step_end(s.step);
    const bool stop = s.any_rank_stopped();
    if (c.checkpoint.enable) {
      const bool periodic = s.step % c.checkpoint.interval == 0 || (s.step == 1 && c.checkpoint.enable_first_step_checkpoint);
      if (s.step == t.steps || stop || periodic) {
        const double t_save = steady_seconds();
        s.save(/*final_save=*/s.step == t.steps);
        window.add_save_seconds(steady_seconds() - t_save);
        result.last_checkpoint = checkpoint::step_folder(s.checkpoint_root, s.step);
      }
    }
    // After the save: a supervisor reading it knows the checkpoint this step committed.
    if (s.lead) write_progress(s.run_folder, s.step, o.loss, first_step, s.committed_step);
    if (tracing()) s.write_trace(log);
    if (stop) {
      result.interrupted = true;
      log.log_event("interrupted at step " + std::to_string(s.step) +
                    (c.checkpoint.enable ? "; checkpoint saved, rerun the same command to resume" : ""));
      break;
    }
  }
  if (s.saver)
    if (const auto dir = s.saver->finish()) s.on_committed(*dir);
  if (s.lead && c.metrics.enable_plots && c.metrics.enable_jsonl) s.draw_plots(log);
  clear_stop_request();  // honoured: a Trainer made next in this process starts afresh
  return result;
}

}  // namespace titan::train
