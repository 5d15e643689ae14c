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
#include "titan/models/deepseek_v3/model.h"
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
  // DeepSeek-V3.2: the model (null for others), its implementation and the stage in force.
  models::deepseek_v3::Transformer* dsa_model = nullptr;
  models::deepseek_v3::DsaImpl dsa_impl = models::deepseek_v3::DsaImpl::small_ops;
  std::optional<models::deepseek_v3::DsaStage> dsa_stage;
  json hf_config;  // the architecture, when it comes from a checkpoint converted from Hugging Face

  explicit State(const JobConfig& c) : cfg(c), schedule(make_lr_schedule(c)) {}

  // Puts the DSA model in the stage of optimizer step `step` + 1 (dense warm-up for the first
  // dsa.warmup_steps steps); returns true when that changed the stage.
  bool update_dsa_stage();
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
  s.model = models::build_model(config.model.name, config.model.flavor, vocab, t.seq_len,
                                {config.model.mtp_layers, config.model.mtp_loss_weight,
                                 s.hf_config.is_null() ? nullptr : &s.hf_config, config.model.moe_load_balance_coeff,
                                 config.model.moe_aux_loss_alpha});
  if (!s.hf_config.is_null())
    std::printf("architecture from the Hugging Face config recorded in %s (model.flavor is not used)\n",
                config.checkpoint.initial_load_path.c_str());
  if (auto* v3 = dynamic_cast<models::deepseek_v3::Transformer*>(s.model.get()); v3 && v3->args().has_indexer()) {
    s.dsa_model = v3;
    s.dsa_impl = models::deepseek_v3::dsa_impl_from_converters(config.model.converters);
  } else {
    TITAN_CHECK(config.model.converters.empty(), source + ": model.converters " + config.model.converters[0] +
                                                     " is not known to model " + config.model.name,
                "remove model.converters (only deepseek_v32 has one: dsa_fused)");
    TITAN_CHECK(config.dsa == Dsa{}, source + ": the [dsa] section is set, but model " + config.model.name +
                                         " has no DeepSeek Sparse Attention",
                "remove the [dsa] keys, or train model.name = \"deepseek_v32\"");
  }
  s.model->init_parameters(uint64_t(config.debug.seed));
  s.model->set_compute_dtype(t.mixed_precision_param == "bfloat16" ? DType::bf16 : DType::f32);
  const std::string& ac = config.activation_checkpoint.mode;
  s.model->set_recompute(ac == "full"        ? models::Recompute::full
                         : ac == "selective" ? models::Recompute::selective
                                             : models::Recompute::none);
  s.params = s.model->named_parameters();
  optim::AdamWConfig oc;
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

bool Trainer::State::update_dsa_stage() {
  using models::deepseek_v3::DsaStage;
  if (!dsa_model) return false;
  const DsaStage want = step < cfg.dsa.warmup_steps ? DsaStage::dense_warmup : DsaStage::sparse;
  if (dsa_stage == want) return false;
  dsa_model->set_dsa(want, dsa_impl, cfg.dsa.indexer_loss_coeff, cfg.dsa.topk);
  dsa_stage = want;
  return true;
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

TrainResult Trainer::train() {
  State& s = *s_;
  const JobConfig& c = s.cfg;
  const Training& t = c.training;
  MetricsLogger log(s.run_folder, stdout);
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
  // The FLOPs per token can change between steps (DeepSeek-V3.2's stages), so the window sums them.
  double window_start = now_seconds(), window_data = 0, window_flops = 0;
  int64_t window_steps = 0;
  while (s.step < t.steps) {
    if (s.update_dsa_stage())
      log.log_event(std::string("DSA stage: ") + models::deepseek_v3::dsa_stage_name(*s.dsa_stage) + " from step " +
                    std::to_string(s.step + 1) +
                    (s.dsa_impl == models::deepseek_v3::DsaImpl::fused ? " (fused kernels)" : " (small ops)"));
    const double t0 = now_seconds();
    memory_reset_peak();
    s.model->zero_grad();
    double loss_sum = 0, aux_sum = 0, data_seconds = 0;
    const Tensor dloss = Tensor::full({1}, 1.0 / double(s.accum), DType::f32);
    for (int64_t micro = 0; micro < s.accum; ++micro) {
      const double d0 = s.train_loader->seconds_spent();
      s.train_loader->next_batch(s.inputs.data<int32_t>(), s.targets.data<int32_t>(), int(t.local_batch_size),
                                 int(t.seq_len));
      data_seconds += s.train_loader->seconds_spent() - d0;
      s.model->set_targets(s.targets);  // multi-token prediction scores tokens further ahead
      Variable loss = autograd::cross_entropy(s.model->forward(s.inputs), s.targets);
      loss_sum += loss.value().item();
      for (const Variable& aux : s.model->auxiliary_losses()) {
        aux_sum += aux.value().item();
        loss = autograd::add(loss, aux);
      }
      autograd::backward(loss, dloss);  // the mean over micro-batches
    }
    const auto norm = optim::clip_grad_norm(s.params, t.max_norm);
    ++s.step;
    const double lr = c.optimizer.lr * s.schedule.lr_factor(s.step);
    s.opt->step(float(lr), norm.scale);
    s.model->after_optimizer_step();
    const double step_seconds = now_seconds() - t0;
    const double loss = loss_sum / double(s.accum);
    TITAN_CHECK(std::isfinite(loss), "training diverged: the loss at step " + std::to_string(s.step) + " is not finite",
                "lower optimizer.lr or raise lr_scheduler.warmup_steps; resume from the last checkpoint");
    result.last_step = s.step;
    result.last_loss = loss;
    ++window_steps;
    window_data += data_seconds;
    window_flops += s.model->training_flops_per_token(t.seq_len) * double(s.accum * t.local_batch_size * t.seq_len);

    if (s.step % c.metrics.log_freq == 0 || s.step == t.steps || s.step == first_step + 1) {
      const double window = now_seconds() - window_start;
      const double tokens = double(window_steps * s.accum * t.local_batch_size * t.seq_len);
      StepMetrics m;
      m.step = s.step;
      m.total_steps = t.steps;
      m.loss = loss;
      m.grad_norm = norm.norm;
      m.lr = lr;
      m.step_seconds = step_seconds;
      m.tokens_per_second = tokens / window;
      m.tflops = window_flops / window / 1e12;
      m.mfu = window_flops / window / peak_flops;
      m.data_share = window_data / window;
      m.eta_seconds = (now_seconds() - start_time) / double(s.step - first_step) * double(t.steps - s.step);
      m.memory = memory_stats();
      for (auto& [k, v] : s.model->step_stats()) m.extra[k] = v;
      if (aux_sum != 0) m.extra["aux_loss"] = aux_sum / double(s.accum);
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
