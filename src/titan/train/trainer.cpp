#include "titan/train/trainer.h"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "titan/autograd/ops.h"
#include "titan/checkpoint/checkpoint.h"
#include "titan/core/cpu_features.h"
#include "titan/core/rng.h"
#include "titan/data/loader.h"
#include "titan/data/tokenizer.h"
#include "titan/kernels/peak.h"
#include "titan/models/causal_lm.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

namespace titan::train {

namespace fs = std::filesystem;
using autograd::Variable;
using nlohmann::json;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_sigint(int) { g_stop.store(true); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What this build does not do yet, refused up front with the key to change.
void check_supported(const JobConfig& c, const std::string& source) {
  const Parallelism& p = c.parallelism;
  const bool single = p.data_parallel_replicate_degree == 1 && p.data_parallel_shard_degree <= 1 &&
                      p.tensor_parallel_degree == 1 && p.pipeline_parallel_degree == 1 &&
                      p.context_parallel_degree == 1 && p.expert_parallel_degree == 1;
  TITAN_CHECK(single, source + ": [parallelism] asks for more than one rank, but this build trains in one process",
              "set every [parallelism] degree to 1 (data_parallel_shard_degree may stay -1)");
  TITAN_CHECK(c.training.dtype == "float32", source + ": training.dtype = \"" + c.training.dtype +
                                                 "\" (pure bf16 training) is not supported yet",
              "use training.dtype = \"float32\" with training.mixed_precision_param = \"bfloat16\"");
  TITAN_CHECK(c.checkpoint.async_mode == "disabled",
              source + ": checkpoint.async_mode = \"" + c.checkpoint.async_mode + "\": asynchronous saves are not in this build yet",
              "set checkpoint.async_mode = \"disabled\" (saves then pause training while they write)");
  TITAN_CHECK(!c.checkpoint.initial_load_in_hf && !c.checkpoint.last_save_in_hf,
              source + ": Hugging Face checkpoint import/export is not in this build yet",
              "set checkpoint.initial_load_in_hf and checkpoint.last_save_in_hf to false");
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

std::string tokenizer_file(const JobConfig& c) {
  if (!c.model.tokenizer_path.empty()) return c.model.tokenizer_path;
  if (!c.model.hf_assets_path.empty()) return (fs::path(c.model.hf_assets_path) / "tokenizer.json").string();
  return {};
}

}  // namespace

// What one optimizer step produced, for the metrics.
struct StepOutcome {
  double loss = 0;  // cross-entropy, the mean over the step's micro-batches
  std::map<std::string, double> terms;  // each auxiliary loss, the same mean
  double grad_norm = 0;
  double lr = 0;
  double data_seconds = 0;  // spent waiting for the loader
};

struct Trainer::State {
  JobConfig cfg;
  std::string source;
  fs::path run_folder, checkpoint_root;
  std::unique_ptr<models::CausalLM> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<data::DataLoader> train_loader, val_loader;
  optim::LrSchedule schedule;
  int64_t accum = 1;
  int64_t step = 0;  // optimizer steps completed
  Tensor inputs, targets;  // [B, S] i32, reused every micro-batch
  std::vector<std::pair<std::string, nn::Parameter*>> params;
  json hf_config;  // the architecture, when it comes from a checkpoint converted from Hugging Face

  explicit State(const JobConfig& c) : cfg(c), schedule(make_lr_schedule(c)) {}

  // One optimizer step: every micro-batch's forward, loss and backward, then clipping, the
  // optimizer and the model's own end-of-step updates.
  StepOutcome train_step(MetricsLogger& log);
  void save(bool final_save);
  void restore(const checkpoint::LoadedCheckpoint& ck, bool model_only);
  double validate();
};

Trainer::Trainer(const JobConfig& config, const std::string& source) : s_(std::make_unique<State>(config)) {
  State& s = *s_;
  s.source = source;
  check_supported(config, source);
  flush_denormals(true);  // see core/cpu_features.h: sharpening attention makes denormals
  s.run_folder = config.job.dump_folder;
  s.checkpoint_root = s.run_folder / config.checkpoint.folder;
  fs::create_directories(s.run_folder);
  {
    std::ofstream(s.run_folder / "config.toml") << to_toml(config);
  }
  if (config.job.print_config) std::printf("the resolved configuration (also in %s):\n%s\n",
                                           (s.run_folder / "config.toml").c_str(), to_toml(config).c_str());

  const Training& t = config.training;
  data::DataLoaderOptions lo;
  lo.dir = (fs::path(t.dataset_path) / "train").string();
  lo.seq_len = int(t.seq_len);
  lo.seed = uint64_t(config.debug.seed);
  s.train_loader = std::make_unique<data::DataLoader>(lo);
  if (config.validation.enable) {
    data::DataLoaderOptions vo;
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
  if (config.checkpoint.enable && !config.checkpoint.initial_load_path.empty())
    s.hf_config = checkpoint::load_train_state(config.checkpoint.initial_load_path).value("hf_config", json());
  models::ModelOptions mo;
  mo.mtp_layers = config.model.mtp_layers;
  mo.mtp_loss_weight = config.model.mtp_loss_weight;
  mo.hf_config = s.hf_config.is_null() ? nullptr : &s.hf_config;
  mo.moe_load_balance_coeff = config.model.moe_load_balance_coeff;
  mo.moe_aux_loss_alpha = config.model.moe_aux_loss_alpha;
  mo.converters = config.model.converters;
  mo.dsa = {config.dsa.warmup_steps, config.dsa.indexer_loss_coeff, config.dsa.topk};
  try {
    s.model = models::build_model(config.model.name, config.model.flavor, vocab, t.seq_len, mo);
  } catch (const Error& e) {
    TITAN_FAIL(source + ": " + e.message(), e.hint());
  }
  if (!s.hf_config.is_null())
    std::printf("architecture from the Hugging Face config recorded in %s (model.flavor is not used)\n",
                config.checkpoint.initial_load_path.c_str());
  s.model->init_parameters(uint64_t(config.debug.seed));
  s.model->set_compute_dtype(t.mixed_precision_param == "bfloat16" ? DType::bf16 : DType::f32);
  const std::string& ac = config.activation_checkpoint.mode;
  s.model->set_recompute(ac == "full"        ? models::Recompute::full
                         : ac == "selective" ? models::Recompute::selective
                                             : models::Recompute::none);
  s.params = s.model->named_parameters();
  kernels::AdamWParams oc;
  oc.lr = float(config.optimizer.lr);
  oc.beta1 = float(config.optimizer.beta1);
  oc.beta2 = float(config.optimizer.beta2);
  oc.eps = float(config.optimizer.eps);
  oc.weight_decay = float(config.optimizer.weight_decay);
  s.opt = std::make_unique<optim::AdamW>(s.params, oc);
  s.accum = gradient_accumulation_steps(config, 1);
  s.inputs = Tensor::empty({t.local_batch_size, t.seq_len}, DType::i32, MemCategory::activations);
  s.targets = Tensor::empty({t.local_batch_size * t.seq_len}, DType::i32, MemCategory::activations);

  // Resume: the newest checkpoint of this run, else the configured initial weights.
  if (config.checkpoint.enable) {
    std::optional<fs::path> from;
    if (config.checkpoint.load_step >= 0) {
      from = checkpoint::step_folder(s.checkpoint_root, config.checkpoint.load_step);
    } else {
      from = checkpoint::latest_checkpoint(s.checkpoint_root);
    }
    if (from) {
      const auto ck = checkpoint::load_checkpoint(*from);
      const bool model_only = !ck.train_state.contains("step");
      s.restore(ck, model_only);
      std::printf("resumed from %s (step %lld)\n", from->string().c_str(), static_cast<long long>(s.step));
    } else if (!config.checkpoint.initial_load_path.empty()) {
      const auto ck = checkpoint::load_checkpoint(config.checkpoint.initial_load_path);
      s.restore(ck, config.checkpoint.initial_load_model_only);
      std::printf("initialized from %s\n", config.checkpoint.initial_load_path.c_str());
    }
  }
}

Trainer::~Trainer() = default;

models::CausalLM& Trainer::model() { return *s_->model; }
const optim::AdamW& Trainer::optimizer() const { return *s_->opt; }

void Trainer::State::restore(const checkpoint::LoadedCheckpoint& ck, bool model_only) {
  std::map<std::string, Tensor> model_state, optim_state;
  for (const auto& [name, t] : ck.tensors) {
    if (name.rfind("model.", 0) == 0) model_state[name.substr(6)] = t;
    if (name.rfind("optim.", 0) == 0) optim_state[name.substr(6)] = t;
  }
  // MTP modules only train: those the checkpoint has beyond model.mtp_layers (DeepSeek-V3's, from
  // Hugging Face) are dropped, and those it lacks (added to a pretrained model, or one converted
  // from a folder transformers saved, which has no MTP weights) keep their init, each said in one
  // line; as do MoE token counts (run-time statistics a converted checkpoint does not have). A
  // module the checkpoint has only part of (e.g. a dense block where ours is MoE) is an error.
  const auto own = model->state_dict();
  const auto is_mtp = [](const std::string& n) { return n.rfind("mtp.", 0) == 0; };
  const auto module_of = [](const std::string& n) { return n.substr(0, n.find('.', 4)); };  // "mtp.K"
  std::set<std::string> own_names, dropped;
  for (const auto& [name, t] : own) own_names.insert(name);
  for (const auto& [name, t] : model_state)
    if (is_mtp(name) && !own_names.count(name)) dropped.insert(module_of(name));
  std::erase_if(model_state, [&](const auto& kv) { return is_mtp(kv.first) && !own_names.count(kv.first); });
  std::map<std::string, std::vector<std::string>> mtp_missing;  // module -> its tensors the checkpoint lacks
  std::map<std::string, size_t> mtp_size;
  for (const auto& [name, t] : own) {
    if (!is_mtp(name) || name.ends_with("tokens_per_expert")) continue;
    ++mtp_size[module_of(name)];
    if (!model_state.count(name)) mtp_missing[module_of(name)].push_back(name);
  }
  std::string fresh;
  for (const auto& [module, missing] : mtp_missing) {
    TITAN_CHECK(missing.size() == mtp_size.at(module),
                "checkpoint step " + std::to_string(ck.step) + " holds part of MTP module " + module + ": '" +
                    missing.front() + "' (and " + std::to_string(missing.size() - 1) + " more) are missing",
                "its MTP module has another architecture than model.mtp_layers builds (e.g. a dense block where "
                "ours is MoE); set model.mtp_layers = 0, or load a checkpoint of this architecture");
    fresh += (fresh.empty() ? "" : ", ") + module;
  }
  if (!fresh.empty())
    std::printf("MTP module %s: not in checkpoint step %lld, starts from a fresh initialization (debug.seed %lld)\n",
                fresh.c_str(), static_cast<long long>(ck.step), static_cast<long long>(cfg.debug.seed));
  if (!dropped.empty()) {
    std::string names;
    for (const std::string& m : dropped) names += (names.empty() ? "" : ", ") + m;
    std::printf("MTP module %s of checkpoint step %lld: not loaded (model.mtp_layers = %lld)\n", names.c_str(),
                static_cast<long long>(ck.step), static_cast<long long>(cfg.model.mtp_layers));
  }
  for (const auto& [name, t] : own)
    if (is_mtp(name) || name.ends_with("tokens_per_expert")) model_state.try_emplace(name, t);
  model->load_state_dict(model_state, true, "checkpoint step " + std::to_string(ck.step));
  model->refresh_compute_copies();
  if (model_only) return;
  opt->load_state_dict(optim_state, "checkpoint step " + std::to_string(ck.step));
  step = ck.train_state.at("step").get<int64_t>();
  train_loader->restore(ck.train_state.at("data").get<data::DataLoaderState>());
}

void Trainer::State::save(bool final_save) {
  checkpoint::SaveRequest req;
  req.step = step;
  req.config_toml = to_toml(cfg);
  const bool model_only = final_save && cfg.checkpoint.last_save_model_only;
  const DType export_dtype = cfg.checkpoint.export_dtype == "bfloat16" ? DType::bf16
                             : cfg.checkpoint.export_dtype == "float16" ? DType::f16
                                                                        : DType::f32;
  for (auto& [name, t] : model->state_dict())
    req.tensors.push_back({"model." + name, model_only && export_dtype != DType::f32 ? t.to(export_dtype) : t, {}});
  if (!model_only) {
    for (auto& [name, t] : opt->state_dict()) req.tensors.push_back({"optim." + name, t, {}});
    req.train_state = {{"step", step}, {"data", train_loader->state()}, {"seed", cfg.debug.seed}};
  } else {
    req.train_state = json::object();
  }
  if (!hf_config.is_null()) req.train_state["hf_config"] = hf_config;  // for generate and convert --to-hf
  const fs::path dir = checkpoint::save_checkpoint(checkpoint_root, req);
  checkpoint::keep_latest(checkpoint_root, int(cfg.checkpoint.keep_latest_k));
  std::printf("checkpoint saved: %s%s\n", dir.string().c_str(), model_only ? " (model only)" : "");
}

double Trainer::State::validate() {
  autograd::NoGradGuard no_grad;
  val_loader->reset();
  const int64_t b = cfg.validation.local_batch_size, sl = cfg.validation.seq_len;
  Tensor in = Tensor::empty({b, sl}, DType::i32, MemCategory::activations);
  Tensor tg = Tensor::empty({b * sl}, DType::i32, MemCategory::activations);
  double total = 0;
  int64_t batches = 0;
  while (cfg.validation.steps < 0 || batches < cfg.validation.steps) {
    if (!val_loader->next_batch(in.data<int32_t>(), tg.data<int32_t>(), int(b), int(sl))) break;
    total += autograd::cross_entropy(model->forward(in), tg).value().item();
    ++batches;
  }
  TITAN_CHECK(batches > 0, "validation: the validation set has fewer than one batch of " + std::to_string(b) + " x " +
                               std::to_string(sl) + " tokens",
              "lower validation.local_batch_size or validation.seq_len, or prepare a larger validation split");
  return total / double(batches);
}

StepOutcome Trainer::State::train_step(MetricsLogger& log) {
  const Training& t = cfg.training;
  if (const std::string event = model->begin_step(step + 1); !event.empty()) log.log_event(event);
  model->zero_grad();
  StepOutcome out;
  const Tensor dloss = Tensor::full({1}, 1.0 / double(accum), DType::f32);  // the mean over micro-batches
  for (int64_t micro = 0; micro < accum; ++micro) {
    const double d0 = train_loader->seconds_spent();
    train_loader->next_batch(inputs.data<int32_t>(), targets.data<int32_t>(), int(t.local_batch_size), int(t.seq_len));
    out.data_seconds += train_loader->seconds_spent() - d0;
    models::TrainingLoss loss = model->training_loss(inputs, targets);
    autograd::backward(loss.total, dloss);
    out.loss += loss.cross_entropy / double(accum);
    for (const auto& [name, v] : loss.terms) out.terms[name] += v / double(accum);
  }
  const auto norm = optim::clip_grad_norm(params, t.max_norm);
  out.grad_norm = norm.norm;
  ++step;
  out.lr = cfg.optimizer.lr * schedule.lr_factor(step);
  opt->step(float(out.lr), norm.scale);
  model->end_step([](Tensor&) {});  // one rank: the local sums are the global ones
  TITAN_CHECK(std::isfinite(out.loss), "training diverged: the loss at step " + std::to_string(step) + " is not finite",
              "lower optimizer.lr or raise lr_scheduler.warmup_steps; resume from the last checkpoint");
  return out;
}

TrainResult Trainer::train() {
  State& s = *s_;
  const JobConfig& c = s.cfg;
  const Training& t = c.training;
  MetricsLogger log(metrics_options(c, s.run_folder));
  const auto peak = kernels::measure_machine_peak(0.2);
  const double peak_flops = s.model->compute_dtype() == DType::bf16 ? peak.bf16_flops : peak.f32_flops;
  std::printf("model %s/%s: %.2fM parameters, %s compute, %lld steps of %lld x %lld tokens (x%lld accumulation)\n",
              c.model.name.c_str(), c.model.flavor.c_str(), double(s.model->num_parameters()) / 1e6,
              s.model->compute_dtype() == DType::bf16 ? "bf16" : "f32", static_cast<long long>(t.steps),
              static_cast<long long>(t.local_batch_size), static_cast<long long>(t.seq_len),
              static_cast<long long>(s.accum));
  std::printf("unigram entropy of the training corpus: %.3f nats/token (the loss of a model that ignores context)\n",
              s.train_loader->unigram_entropy());
  g_stop.store(false);
  auto previous = std::signal(SIGINT, on_sigint);
  TrainResult result;
  result.run_folder = s.run_folder;
  const double start_time = now_seconds();
  const int64_t first_step = s.step;
  const double tokens_per_step = double(s.accum * t.local_batch_size * t.seq_len);
  // The FLOPs per token can change between steps (DeepSeek-V3.2's stages), so the window sums them.
  double window_start = now_seconds(), window_data = 0, window_flops = 0;
  int64_t window_steps = 0;
  while (s.step < t.steps) {
    const double t0 = now_seconds();
    memory_reset_peak();
    const StepOutcome o = s.train_step(log);
    const double step_seconds = now_seconds() - t0;
    result.last_step = s.step;
    result.last_loss = o.loss;
    ++window_steps;
    window_data += o.data_seconds;
    window_flops += s.model->training_flops_per_token(t.seq_len) * tokens_per_step;

    if (s.step % c.metrics.log_freq == 0 || s.step == t.steps || s.step == first_step + 1) {
      const double window = now_seconds() - window_start;
      StepMetrics m;
      m.step = s.step;
      m.total_steps = t.steps;
      m.loss = o.loss;
      m.grad_norm = o.grad_norm;
      m.lr = o.lr;
      m.step_seconds = step_seconds;
      m.tokens_per_second = double(window_steps) * tokens_per_step / window;
      m.tflops = window_flops / window / 1e12;
      m.mfu = window_flops / window / peak_flops;
      m.data_share = window_data / window;
      m.eta_seconds = (now_seconds() - start_time) / double(s.step - first_step) * double(t.steps - s.step);
      m.memory = memory_stats();
      for (const auto& [k, v] : o.terms) m.summary.emplace_back(k, v);
      const models::StepStats stats = s.model->step_stats();
      m.summary.insert(m.summary.end(), stats.summary.begin(), stats.summary.end());
      m.detail = stats.detail;
      log.log_step(m);
      window_start = now_seconds();
      window_data = 0, window_flops = 0;
      window_steps = 0;
    }
    if (s.val_loader && (s.step % c.validation.freq == 0 || s.step == t.steps)) {
      result.last_val_loss = s.validate();
      log.log_validation(s.step, result.last_val_loss, std::exp(result.last_val_loss));
    }
    if (on_step_end) on_step_end(s.step);
    const bool stop = g_stop.load();
    if (c.checkpoint.enable) {
      const bool periodic = s.step % c.checkpoint.interval == 0 || (s.step == 1 && c.checkpoint.enable_first_step_checkpoint);
      if (s.step == t.steps || stop || periodic) {
        s.save(/*final_save=*/s.step == t.steps);
        result.last_checkpoint = checkpoint::step_folder(s.checkpoint_root, s.step);
      }
    }
    if (stop) {
      result.interrupted = true;
      log.log_event("interrupted at step " + std::to_string(s.step) +
                    (c.checkpoint.enable ? "; checkpoint saved, rerun the same command to resume" : ""));
      break;
    }
  }
  std::signal(SIGINT, previous);
  return result;
}

}  // namespace titan::train
