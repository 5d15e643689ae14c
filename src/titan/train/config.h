// The job configuration: TOML in TorchTitan's TOML-era layout ([job] [model] [training] ...),
// with command-line overrides `--section.key=value`.
//
// One table (config_schema()) describes every key: its section, name, type, the field it
// fills, the values it accepts and its documentation. Parsing, validation, the --help listing,
// docs/config.md and the resolved TOML written next to a run all come from that table, so a
// key added there is parsed, checked, listed and documented at once.
//
// A key with a closed set of values holds an enum class once parsed (config_choices.h and the
// enums of the layers below), so that code switches on it instead of comparing strings; the
// TOML, the command line, messages and the resolved TOML spell it by the enum's names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "titan/core/dtype_torch_names.h"
#include "titan/distributed/fsdp_reshard.h"
#include "titan/distributed/pipeline_schedule.h"
#include "titan/models/recompute.h"
#include "titan/optim/lr_scheduler.h"
#include "titan/optim/muon.h"
#include "titan/train/config_choices.h"

namespace titan::models {
const std::string& default_model_name();  // models/family.h: the first registered family
}

namespace titan::train {

// Defaults follow TorchTitan's where it has the key, so its users find what they expect.
struct Job {
  std::string dump_folder = "./outputs";
  std::string description = "default job";
  bool print_config = false;
  bool operator==(const Job&) const = default;
};

struct Model {
  std::string name = models::default_model_name();
  std::string flavor = "debugmodel";
  std::string hf_assets_path;
  std::string tokenizer_path;
  std::vector<std::string> converters;
  int64_t mtp_layers = 0;        // DeepSeek-V3 multi-token prediction depth D (0: off)
  double mtp_loss_weight = 0.3;  // its loss weight lambda
  double moe_load_balance_coeff = 1e-3;  // MoE aux-loss-free balancing: bias update per step
  double moe_aux_loss_alpha = 0;         // MoE sequence-wise auxiliary loss weight (0: off)
  bool operator==(const Model&) const = default;
};

struct Optimizer {
  OptimizerKind name = OptimizerKind::adamw;
  double lr = 8e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  OptimizerSwap swap = OptimizerSwap::none;
  std::string swap_path = "optimizer_swap";
  int64_t swap_chunk_mb = 64;
  // name = "Muon": the hidden matrices' optimizer (the others keep AdamW with the keys above).
  std::optional<double> muon_lr;  // unset: lr
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  optim::MuonLrAdjust muon_adjust_lr = optim::MuonLrAdjust::match_rms_adamw;
  DType muon_ns_dtype = DType::f32;  // the Newton-Schulz GEMMs' inputs
  bool operator==(const Optimizer&) const = default;
};

struct LrScheduler {
  int64_t warmup_steps = 200;
  std::optional<double> decay_ratio;  // unset: decay starts right after warmup
  optim::LrDecay decay_type = optim::LrDecay::linear;
  double min_lr_factor = 0.0;
  bool operator==(const LrScheduler&) const = default;
};

struct Training {
  std::string dataset = "c4_test";
  std::string dataset_path;
  int64_t local_batch_size = 8;
  int64_t global_batch_size = -1;  // -1: local_batch_size x data-parallel degree
  int64_t seq_len = 2048;
  double max_norm = 1.0;
  int64_t steps = 10000;
  DType dtype = DType::f32;
  DType mixed_precision_param = DType::bf16;
  // The data-parallel gradient reductions' wire type (TorchTitan's mixed_precision_reduce): cast
  // before, summed in f32 inside the reduction, read back into the f32 gradients.
  DType gradient_sync_dtype = DType::f32;
  // Dynamic loss scaling with PyTorch GradScaler's names and seed 003's defaults (train/loss_scaler.h).
  LossScaling loss_scaling = LossScaling::auto_;
  double loss_scale_init = 32768;
  double loss_scale_growth_factor = 2;
  double loss_scale_backoff_factor = 0.5;
  int64_t loss_scale_growth_interval = 2000;
  double loss_scale_min = 1;
  bool scales_loss() const {
    return loss_scaling == LossScaling::dynamic ||
           (loss_scaling == LossScaling::auto_ && mixed_precision_param == DType::f16);
  }
  bool operator==(const Training&) const = default;
};

struct Parallelism {
  int64_t data_parallel_replicate_degree = 1;
  int64_t data_parallel_shard_degree = -1;  // -1: the ranks the other dimensions leave
  distributed::ReshardAfterForward fsdp_reshard_after_forward = distributed::ReshardAfterForward::per_unit;
  int64_t tensor_parallel_degree = 1;
  bool enable_async_tensor_parallel = false;  // TorchTitan's key (llama3; distributed/async_tensor_parallel.h)
  MoeTpScheme moe_tp_scheme = MoeTpScheme::sequence;
  // TorchTitan's scheme splits each routed expert's hidden units over TP (its "etp = tp"), so
  // expert parallelism borrows no TP ranks and every TP rank counts the same tokens.
  bool experts_split_over_tp() const { return moe_tp_scheme == MoeTpScheme::gather; }
  int64_t pipeline_parallel_degree = 1;
  distributed::pp::ScheduleKind pipeline_parallel_schedule = distributed::pp::ScheduleKind::one_f_one_b;
  int64_t pipeline_parallel_microbatch_size = 1;
  // TorchTitan's stage split: the embedding and the output head count as this many blocks.
  int64_t pipeline_parallel_first_stage_less_layers = 1;
  int64_t pipeline_parallel_last_stage_less_layers = 1;
  // DualPipeV's F&B pairs take turns at expert-parallel all-to-alls (distributed/compute_pair.h).
  bool pipeline_parallel_expert_parallel_overlap = true;
  // How a pipeline rank sums its micro-batches' gradients (train/pipeline_step.h): in_place | tree.
  GradientSum pipeline_parallel_gradient_sum = GradientSum::in_place;
  bool pipeline_tree_sum() const { return pipeline_parallel_gradient_sum == GradientSum::tree; }
  // FSDP under PP (distributed/fsdp.h): zero3 | per_step.
  PipelineFsdp pipeline_parallel_fsdp = PipelineFsdp::zero3;
  int64_t context_parallel_degree = 1;
  int64_t expert_parallel_degree = 1;
  bool operator==(const Parallelism&) const = default;
};

// The communication layer: the watchdog and the flight recorder (TorchTitan's [comm] keys).
struct Comm {
  int64_t init_timeout_seconds = 300;  // the watchdog's deadline per collective until the first step ends
  int64_t timeout_seconds = 100;       // ... afterwards
  int64_t trace_buf_size = 20000;      // collectives the flight recorder keeps
  std::string save_traces_folder = "comm_traces";  // under job.dump_folder: where the dumps go
  bool operator==(const Comm&) const = default;
};

struct Checkpoint {
  bool enable = false;
  std::string folder = "checkpoint";
  int64_t interval = 500;
  CheckpointAsyncMode async_mode = CheckpointAsyncMode::disabled;
  int64_t staging_mib = 256;  // the buffer a save streams each rank's file through
  int64_t keep_latest_k = 10;
  int64_t load_step = -1;  // -1: the latest
  int64_t load_at_most = -1;  // the newest step resume considers (-1: no bound); titan launch's restarts
  bool last_save_model_only = true;
  DType export_dtype = DType::f32;
  std::string initial_load_path;
  bool initial_load_model_only = true;
  bool initial_load_in_hf = false;
  bool last_save_in_hf = false;
  bool enable_first_step_checkpoint = false;
  bool allow_optimizer_switch = false;  // a checkpoint of another optimizer.name loads without its state
  bool operator==(const Checkpoint&) const = default;
};

struct ActivationCheckpoint {
  models::Recompute mode = models::Recompute::selective;
  bool operator==(const ActivationCheckpoint&) const = default;
};

struct Metrics {
  int64_t log_freq = 10;
  bool enable_jsonl = true;
  std::string jsonl_file = "metrics.jsonl";
  bool save_for_all_ranks = false;
  bool disable_color_printing = false;
  bool enable_tensorboard = false;
  std::string save_tb_folder = "tb";
  bool enable_plots = true;
  bool operator==(const Metrics&) const = default;
};

// Looking at a run (TorchTitan's [profiling] keys): traces and memory snapshots of some steps.
struct Profiling {
  bool enable_profiling = false;
  std::string save_traces_folder = "profile_trace";
  int64_t profile_freq = 10;
  bool enable_memory_snapshot = false;
  std::string save_memory_snapshot_folder = "memory_snapshot";
  bool operator==(const Profiling&) const = default;
};

struct Validation {
  bool enable = false;
  std::string dataset = "c4_validation";
  std::string dataset_path;
  int64_t local_batch_size = 8;
  int64_t seq_len = 2048;
  int64_t freq = 10;
  int64_t steps = -1;  // -1: the whole validation set
  bool operator==(const Validation&) const = default;
};

// DeepSeek Sparse Attention training (model deepseek_v32; models/deepseek_v3/dsa.h).
struct Dsa {
  int64_t warmup_steps = 0;          // dense warm-up steps (indexer only), then sparse; 0: sparse from the start
  double indexer_loss_coeff = 0.01;  // weight of the indexer's KL loss (Megatron-LM's DSA test value)
  int64_t topk = 0;                  // keys per query in the sparse stage; 0: the flavor's index_topk
  bool operator==(const Dsa&) const = default;
};

struct Fault {
  NonFinitePolicy on_nonfinite = NonFinitePolicy::abort;
  int64_t inject_nonfinite_at_step = 0;  // 0: never (testing the handling)
  int64_t inject_rank = 0;
  double inject_step_delay_seconds = 0;  // testing: a straggler
  bool operator==(const Fault&) const = default;
};

// [quantize.linear.float8], [quantize.linear.mx], [quantize.grouped_mm.float8], [quantize.grouped_mm.mx]:
// the options of the quantization converters [model] converters names (TorchTitan's TOML-era
// sections and keys; models/quantize.h applies them, docs/precision.md explains the recipes).
// Linear converters quantize every nn::Linear whose name contains none of filter_fqns; grouped_mm
// converters quantize the routed experts whose name contains one of fqns.
struct QuantizeLinear {
  std::string recipe_name;
  std::vector<std::string> filter_fqns = {"output"};
  // [quantize.linear.float8] only: FSDP gathers the FP8 blockwise weights as E4M3 codes with their
  // block scales (distributed/fsdp.h: FsdpOptions::fp8_all_gather) instead of in bf16 / f32.
  bool enable_fsdp_float8_all_gather = false;
  bool operator==(const QuantizeLinear&) const = default;
};
struct QuantizeGroupedMm {
  std::string recipe_name;
  std::vector<std::string> fqns = {"experts"};
  bool operator==(const QuantizeGroupedMm&) const = default;
};

struct Debug {
  int64_t seed = 0;
  bool operator==(const Debug&) const = default;
};

struct JobConfig {
  Job job;
  Model model;
  Training training;
  Optimizer optimizer;
  LrScheduler lr_scheduler;
  Parallelism parallelism;
  Comm comm;
  Checkpoint checkpoint;
  ActivationCheckpoint activation_checkpoint;
  Metrics metrics;
  Profiling profiling;
  Validation validation;
  Dsa dsa;
  Fault fault;
  QuantizeLinear quantize_linear_float8{"blockwise"};
  QuantizeLinear quantize_linear_mx{"mxfp8"};
  QuantizeGroupedMm quantize_grouped_mm_float8{"blockwise"};
  QuantizeGroupedMm quantize_grouped_mm_mx{"mxfp8"};
  Debug debug;
  bool operator==(const JobConfig&) const = default;
};

// ---- the schema -------------------------------------------------------------------------------

// An enum-valued key's field seen through its enum's names (core/enum_names.h), so that one code
// path parses, checks, prints and documents every closed-choice key whatever its enum.
struct EnumRef {
  void* field;
  std::string_view (*name)(const void* field);         // the name of the value held
  bool (*assign)(void* field, std::string_view name);  // sets the value called `name`; false if none is
};

// Where one key's value lives inside a JobConfig; the alternative held is the key's type.
using FieldRef = std::variant<int64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                              std::optional<double>*, EnumRef>;

// The values a key accepts beyond its type. Numbers: the range [min, max] (each end open when
// its flag says so) plus one sentinel integer with a special meaning (e.g. -1 = "derive it").
// Strings, list elements and enum-valued keys: `choices` when non-empty (an enum-valued key's
// names, in the order messages list them); `non_empty` forbids "".
struct Rule {
  std::optional<double> min, max;
  bool min_open = false, max_open = false;
  std::optional<int64_t> sentinel;
  std::vector<std::string_view> choices;
  bool non_empty = false;
};

struct KeySpec {
  std::string_view section;
  std::string_view key;
  FieldRef (*field)(JobConfig&);
  Rule rule;
  std::string_view doc;
};

struct SectionSpec {
  std::string_view name;
  std::string_view doc;
};

const std::vector<SectionSpec>& config_sections();
const std::vector<KeySpec>& config_schema();  // grouped by section, in config_sections() order

// "an integer >= 1, or -1", "one of: linear, sqrt, cosine", ...: what `spec` accepts.
std::string accepted_values(const KeySpec& spec);

// ---- loading and writing ------------------------------------------------------------------------

// Reads `toml_file`, applies `overrides` in order (each "--section.key=value" or the two
// arguments "--section.key" "value"; a bare "--section.key" sets a boolean key to true), and
// validates the result. Lists are comma-separated on the command line ("--model.converters=a,b");
// "none" unsets an optional key. Throws titan::Error naming the file, the key (or the override)
// and what would be accepted.
JobConfig load_config(const std::filesystem::path& toml_file, const std::vector<std::string>& overrides = {});

// The same from TOML text; `source_name` stands for the file in messages (e.g. a checkpoint's
// metadata.json, which carries the config of the run that wrote it).
JobConfig parse_config(std::string_view toml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides = {});

// Checks every key's accepted values and the constraints between keys (warmup within the run,
// global batch a multiple of the local one, ...). load_config runs it; call it again after
// changing a JobConfig in code.
void validate(const JobConfig& config);

// Every key with its resolved value, in schema order; load_config reads it back to an equal
// JobConfig. Written to the run folder so that a run records exactly what it ran with.
std::string to_toml(const JobConfig& config);

// The `--help` listing of every key: override syntax, type, default, accepted values, doc.
std::string config_help();

// The reference tables of docs/config.md (one per section).
std::string config_reference_markdown();

// ---- derived values -----------------------------------------------------------------------------

// Micro-batches accumulated per optimizer step: global_batch_size / (local_batch_size x
// dp_degree), where dp_degree = data_parallel_replicate x data_parallel_shard ranks. Throws
// when the global batch is not a multiple of one micro-batch step over all data-parallel ranks.
int64_t gradient_accumulation_steps(const JobConfig& config, int64_t dp_degree);

// The tokenizer file the config names: model.tokenizer_path, else tokenizer.json in
// model.hf_assets_path, else "".
std::string tokenizer_file(const JobConfig& c);

// The learning-rate schedule [lr_scheduler] and training.steps describe.
optim::LrSchedule make_lr_schedule(const JobConfig& config);

}  // namespace titan::train
