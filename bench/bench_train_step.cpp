// Whole-model training throughput in f32 and bf16 mixed precision (our tokens/s, MFU against the
// measured peak, peak memory) and, when PyTorch is at hand, the same model trained with AdamW in
// PyTorch on this machine, with the ratios (tokens/s, resident-memory growth) of one run. PyTorch
// is reference/.venv/bin/python when that exists, else the system's python3 when it imports torch
// and transformers.
// Only steady-state steps count on both sides (the best of --steps after one warm-up step; 8 for
// DeepSeek, 3 for Llama-3 by default).
//
//   --model llama3 (flavor 125M, batch 4 x seq 1024): against plain PyTorch modules of the same
//     shape (reference/bench_llama3_torch.py, SDPA attention), eager and torch.compile; target
//     >= 1.5x eager.
//   --model deepseek_v3 (flavors debugmodel and 100M, batch 2 x seq 512): against Hugging Face
//     transformers' DeepseekV3ForCausalLM built from the flavor's own config.json
//     (hf_config_from_args; reference/bench_deepseek_v3_torch.py), eager: eager attention (the
//     [S, S] scores materialized) and transformers' "eager" experts, a Python loop over the
//     experts that received tokens (gather, two linears, SwiGLU, index_add per expert), with the
//     router in f32 (its sigmoid swapped for softmax on softmax-routed flavors, as ours). Targets:
//     >= 2x tokens/s with lower peak memory (RSS growth ratio < 1), in f32 and bf16.
//   --model deepseek_v4 (flavor debugmodel, batch 4 x seq 256): against transformers'
//     DeepseekV4ForCausalLM built from exactly the config.json hf_config(args) writes for the
//     flavor (reference/bench_deepseek_v4_torch.py), eager attention and eager experts, f32
//     and bf16 (ours: bf16 GEMMs around f32 streams and kernels; transformers': autocast). Ours trains the CSA indexers with their KL loss ([dsa] indexer_loss_coeff 0.01, the
//     default); transformers' indexers get no gradient. Hash-routed layers get the same balanced
//     tid2eid table on both sides (titan's fresh one; the PyTorch twin fills transformers' zeros
//     so). Target: >= 3x tokens/s in each dtype.
//   Llama-3 also runs with selective activation checkpointing (--recompute selective in the child),
//   compared with torch.compile, whose partitioner likewise recomputes cheap ops.
//
//   build/bench/bench_train_step [--model llama3|deepseek_v3|deepseek_v4] [--flavor F[,F...]] [--batch B]
//                                [--seq S] [--steps N] [--recompute none|selective|full] [--no-torch]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_training.h"
#include "titan/autograd/ops.h"
#include "titan/core/allocator.h"
#include "titan/core/cpu_features.h"
#include "titan/core/dtype_torch_names.h"
#include "titan/core/rng.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/hf_adapter.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/models/llama3/model.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

using namespace titan;

namespace {

constexpr int64_t kVocab = 2048;  // the main job's tokenizer

struct Setup {
  std::string model = "llama3", flavor;
  int64_t batch = 0, seq = 0;
  int steps = 0;  // 0: the model's default (main)
  models::Recompute recompute = models::Recompute::none;  // activation checkpointing
  bool deepseek() const { return model == "deepseek_v3"; }
  bool v4() const { return model == "deepseek_v4"; }
  std::string args() const {
    return " --model " + model + " --flavor " + flavor + " --batch " + std::to_string(batch) + " --seq " +
           std::to_string(seq) + " --steps " + std::to_string(steps) + " --recompute " + std::string(name_of(recompute));
  }
};

// What the flavor is, from its args (without building it): parameters and FLOPs per token.
struct Shape {
  int64_t parameters = 0, active = 0;
  double flops_per_token = 0;
};

models::deepseek_v3::DeepSeekV3Args deepseek_args(const Setup& s) {
  auto a = models::deepseek_v3::deepseek_v3_flavor(s.flavor, kVocab);
  a.max_seq_len = std::max(a.max_seq_len, s.seq);
  return a;
}

models::deepseek_v4::DeepSeekV4Args v4_args(const Setup& s) {
  auto a = models::deepseek_v4::deepseek_v4_flavor(s.flavor, kVocab);
  a.max_seq_len = std::max(a.max_seq_len, s.seq);
  return a;
}

models::llama3::Llama3Args llama_args(const Setup& s) {
  auto a = models::llama3::llama3_flavor(s.flavor, kVocab);
  a.max_seq_len = std::max(a.max_seq_len, s.seq);
  return a;
}

Shape shape_of(const Setup& s) {
  Shape out;
  if (s.deepseek()) {
    const auto a = deepseek_args(s);
    out.parameters = a.parameters().total, out.active = a.parameters().active;
    out.flops_per_token = a.training_flops_per_token(s.seq);
  } else if (s.v4()) {
    // The built model's own count (DeepSeekV4Args::parameters() counts hc_head's base and scale
    // as 2 * hc_mult, 3 more than the model holds) and FLOPs.
    const auto model = models::build_model(s.model, s.flavor, kVocab, s.seq);
    for (const auto& [name, p] : model->named_parameters()) out.parameters += p->var.value().numel();
    out.active = out.parameters - (v4_args(s).parameters().total - v4_args(s).parameters().active);
    out.flops_per_token = model->training_flops_per_token(s.seq);
  } else {
    const auto a = llama_args(s);
    out.parameters = out.active = a.num_parameters();
    out.flops_per_token = a.training_flops_per_token(s.seq);
  }
  return out;
}

struct Result {
  double tokens_per_second = 0, mfu = 0;
  int64_t peak_bytes = 0;  // our allocator's peak (all tensors)
  int64_t rss_growth = 0;  // peak resident memory growth over the run, comparable with PyTorch's
};

// One trainer step as the trainer takes it: the model's training loss (+ its auxiliary losses),
// backward, gradient clipping, AdamW, then the model's end-of-step update (MoE bias balancing).
Result run_ours_here(const Setup& s, DType compute) {
  const int64_t rss0 = bench::max_rss_bytes();
  flush_denormals(true);  // as the trainer does
  std::unique_ptr<models::CausalLM> model = models::build_model(s.model, s.flavor, kVocab, s.seq);
  model->init_parameters(0);
  // V4's hash layers start from the balanced tid2eid[v, j] = (v K + j) % E (models/moe/moe.h); the
  // PyTorch twin (reference/bench_deepseek_v4_torch.py) fills transformers' zeros the same way.
  model->set_compute_dtype(compute);
  model->set_recompute(s.recompute);
  bench::TrainingStep step(*model, s.batch, s.seq, kVocab);
  memory_reset_peak();
  const double best = bench::time_best([&] { step(); }, s.steps, 1);
  const auto peak = kernels::measure_machine_peak(0.3);
  Result r;
  r.tokens_per_second = double(s.batch * s.seq) / best;
  r.mfu = model->training_flops_per_token(s.seq) * r.tokens_per_second /
          (compute == DType::bf16 ? peak.bf16_flops : peak.f32_flops);
  r.peak_bytes = memory_stats().peak_total;
  r.rss_growth = bench::max_rss_bytes() - rss0;
  return r;
}

// Each configuration runs in a fresh process (this binary with --child), so its resident-memory
// high-water mark is its own. (fork() would inherit OpenMP's thread pool, which libgomp does not
// support in the child.)
std::string g_self;

Result run_ours(const Setup& s, DType compute) {
  const std::string out =
      bench::read_command(g_self + " --child " + (compute == DType::bf16 ? "bf16" : "f32") + s.args());
  Result r;
  if (out.empty()) {
    std::fprintf(stderr, "benchmark child failed\n");
    return r;
  }
  const auto j = nlohmann::json::parse(out.substr(out.rfind('{')));
  r.tokens_per_second = j["tokens_per_second"];
  r.mfu = j["mfu"];
  r.peak_bytes = j["peak_bytes"];
  r.rss_growth = j["rss_growth"];
  return r;
}

// The Python that runs the PyTorch twins: reference/.venv's (reference/setup_venv.sh) when it
// exists, else the system's python3 when it imports torch and transformers; "" when neither.
const std::string& torch_python() {
  static const std::string py = [] {
    if (std::filesystem::exists("reference/.venv/bin/python")) return std::string("reference/.venv/bin/python");
    if (std::system("python3 -c 'import torch, transformers' >/dev/null 2>&1") == 0) return std::string("python3");
    return std::string();
  }();
  return py;
}

// The PyTorch twin's JSON line, or nothing when no Python has torch or the script failed.
std::optional<nlohmann::json> run_torch(const Setup& s, DType dtype, const char* mode) {
  const std::string& py = torch_python();
  if (py.empty()) return std::nullopt;
  const std::string common = " --batch " + std::to_string(s.batch) + " --seq " + std::to_string(s.seq) +
                             " --steps " + std::to_string(s.steps) + " --dtype " + std::string(name_of(dtype));  // PyTorch's name
  std::string cmd;
  std::filesystem::path config;
  if (s.deepseek() || s.v4()) {
    // transformers builds the model from exactly the config.json our HF export writes for the flavor.
    config = std::filesystem::temp_directory_path() /
             ("bench_train_step_" + s.model + "_" + s.flavor + "_" + std::to_string(getpid()) + ".json");
    std::ofstream(config) << (s.v4() ? models::deepseek_v4::hf_config(v4_args(s))
                                     : models::deepseek_v3::hf_config_from_args(deepseek_args(s)))
                                    .dump(2);
    cmd = py + " reference/bench_" + s.model + "_torch.py --config " + config.string() + common;
  } else {
    const auto a = llama_args(s);
    cmd = py + " reference/bench_llama3_torch.py --dim " + std::to_string(a.dim) + " --layers " +
          std::to_string(a.n_layers) + " --heads " + std::to_string(a.n_heads) + " --vocab " +
          std::to_string(a.vocab_size) + common + " --mode " + mode;
  }
  const std::string out = bench::read_command(cmd + " 2>/dev/null");
  if (!config.empty()) std::filesystem::remove(config);
  if (out.empty()) return std::nullopt;
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

void bench_torch_rows(const Setup& s, const Shape& shape, const std::vector<std::pair<DType, const Result*>>& ours_by_dtype,
                      const std::vector<const char*>& modes, double target, const std::vector<const Result*>& selective);

void bench_flavor(const Setup& s, bool torch) {
  const Shape shape = shape_of(s);
  char active[40] = "";
  if (shape.active != shape.parameters) std::snprintf(active, sizeof active, " (%.1fM active)", double(shape.active) / 1e6);
  std::printf("\n%s %s: %.1fM parameters%s, batch %lld x seq %lld, %.2f GFLOP/token (TorchTitan's count)\n",
              s.model.c_str(), s.flavor.c_str(), double(shape.parameters) / 1e6, active,
              static_cast<long long>(s.batch), static_cast<long long>(s.seq), shape.flops_per_token / 1e9);
  if (s.v4())
    std::printf("titan trains the CSA indexers with their KL loss (coeff 0.01, the default); transformers' "
                "indexers get no gradient\n");
  const Result f32 = run_ours(s, DType::f32);
  std::printf("titan f32 : %8.0f tok/s  MFU %5.1f%%  tensors peak %s, RSS growth %s\n", f32.tokens_per_second,
              100 * f32.mfu, train::format_bytes(double(f32.peak_bytes)).c_str(),
              train::format_bytes(double(f32.rss_growth)).c_str());
  const Result bf = run_ours(s, DType::bf16);
  std::printf("titan bf16: %8.0f tok/s  MFU %5.1f%%  tensors peak %s, RSS growth %s", bf.tokens_per_second,
              100 * bf.mfu, train::format_bytes(double(bf.peak_bytes)).c_str(),
              train::format_bytes(double(bf.rss_growth)).c_str());
  if (s.deepseek() || s.v4()) std::printf("\n");
  else std::printf("   [%s bf16 MFU >= 40%%]\n", bench::verdict(bf.mfu, 0.40));
  // Llama-3 also with selective activation checkpointing (GEMM and attention outputs kept, the
  // rest recomputed): the memory / speed trade torch.compile's recomputing partitioner makes.
  Result sel_f32, sel_bf;
  if (!s.deepseek() && !s.v4()) {
    Setup sel = s;
    sel.recompute = models::Recompute::selective;
    sel_f32 = run_ours(sel, DType::f32), sel_bf = run_ours(sel, DType::bf16);
    for (const Result* r : {&sel_f32, &sel_bf})
      std::printf("titan %-4s selective AC: %8.0f tok/s  MFU %5.1f%%  tensors peak %s, RSS growth %s\n",
                  r == &sel_f32 ? "f32" : "bf16", r->tokens_per_second, 100 * r->mfu,
                  train::format_bytes(double(r->peak_bytes)).c_str(), train::format_bytes(double(r->rss_growth)).c_str());
  }
  if (!torch) return;
  // Targets against eager: Llama-3 >= 1.5x tokens/s; DeepSeek-V3 >= 2x with less memory.
  const double target = s.v4() ? 3.0 : s.deepseek() ? 2.0 : 1.5;
  const std::vector<const char*> modes = s.deepseek() || s.v4() ? std::vector<const char*>{"eager"}
                                                      : std::vector<const char*>{"eager", "compile"};
  bench_torch_rows(s, shape, {{DType::f32, &f32}, {DType::bf16, &bf}}, modes, target, {&sel_f32, &sel_bf});
}

// The PyTorch rows: per dtype (with our result in it) and mode, PyTorch's tokens/s and RSS growth
// and the ratios; selective: our selective-AC results (f32, bf16) for the compile rows, if any.
void bench_torch_rows(const Setup& s, const Shape& shape, const std::vector<std::pair<DType, const Result*>>& ours_by_dtype,
                      const std::vector<const char*>& modes, double target, const std::vector<const Result*>& selective) {
  for (const auto& [dtype, ours_ptr] : ours_by_dtype) {
    const Result& ours = *ours_ptr;
    const std::string torch_name(name_of(dtype));  // PyTorch's name, as the reference script takes it
    for (const char* mode : modes) {
      const auto t = run_torch(s, dtype, mode);
      if (!t) {
        std::printf("pytorch %s %s: not run (no Python with torch and transformers: reference/.venv or python3; "
                    "or the script failed)\n",
                    mode, torch_name.c_str());
        continue;
      }
      const double tps = (*t)["tokens_per_second"];
      const double rss = double((*t)["peak_rss_bytes"].get<int64_t>() - (*t)["rss_before_bytes"].get<int64_t>());
      const double speed = ours.tokens_per_second / tps, memory = double(ours.rss_growth) / rss;
      std::string verdicts;
      if (std::string(mode) == "compile" && selective.size() == 2) {
        const Result& sel = *selective[dtype == DType::f32 ? 0 : 1];
        char buf[96];
        std::snprintf(buf, sizeof buf, "; with selective AC %.2fx tokens/s, %.2fx memory",
                      sel.tokens_per_second / tps, double(sel.rss_growth) / rss);
        verdicts = buf;
      }
      if (std::string(mode) == "eager") {
        char buf[32];
        std::snprintf(buf, sizeof buf, " >= %.1fx]", target);
        verdicts = std::string(" [") + bench::verdict(speed, target) + buf;
        if (s.deepseek()) verdicts += std::string(" [") + (memory < 1 ? "PASS" : "MISS") + " memory < 1x]";
      }
      std::printf("pytorch %-7s %-8s: %8.0f tok/s, training memory (RSS growth) %s -> titan/pytorch tokens/s %.2fx, "
                  "memory (RSS growth) %.2fx%s\n",
                  mode, torch_name.c_str(), tps, train::format_bytes(rss).c_str(), speed, memory, verdicts.c_str());
      if (t->contains("parameters") && (*t)["parameters"].get<int64_t>() != shape.parameters)
        std::printf("  note: the PyTorch model has %lld parameters, ours %lld\n",
                    static_cast<long long>((*t)["parameters"].get<int64_t>()), static_cast<long long>(shape.parameters));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Setup s;
  std::string flavors;
  bool torch = true;
  std::string child;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--child" && i + 1 < argc) child = argv[++i];
    else if (a == "--model" && i + 1 < argc) s.model = argv[++i];
    else if (a == "--flavor" && i + 1 < argc) flavors = argv[++i];
    else if (a == "--batch" && i + 1 < argc) s.batch = std::atoll(argv[++i]);
    else if (a == "--seq" && i + 1 < argc) s.seq = std::atoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) s.steps = std::atoi(argv[++i]);
    else if (a == "--recompute" && i + 1 < argc) {
      const std::optional<models::Recompute> r = enum_named<models::Recompute>(argv[++i]);
      TITAN_CHECK(r.has_value(), std::string("bench_train_step: unknown --recompute '") + argv[i] + "'",
                  "use --recompute none, selective or full");
      s.recompute = *r;
    }
    else if (a == "--no-torch") torch = false;
  }
  TITAN_CHECK(s.model == "llama3" || s.deepseek() || s.v4(), "bench_train_step: unknown --model '" + s.model + "'",
              "use --model llama3, deepseek_v3 or deepseek_v4");
  // Defaults sized so that one step takes seconds on a small CPU box.
  if (flavors.empty()) flavors = s.deepseek() ? "debugmodel,100M" : s.v4() ? "debugmodel" : "125M";
  if (s.batch == 0) s.batch = s.deepseek() ? 2 : 4;
  if (s.seq == 0) s.seq = s.deepseek() ? 512 : s.v4() ? 256 : 1024;
  // DeepSeek steps take about a second here, so the best of more of them (on both sides) damps
  // this shared machine's noise, which moved single figures by 5-10%.
  if (s.steps == 0) s.steps = s.deepseek() || s.v4() ? 8 : 3;
  if (!child.empty()) {
    s.flavor = flavors;
    const Result r = run_ours_here(s, child == "bf16" ? DType::bf16 : DType::f32);
    std::printf("%s\n", nlohmann::json{{"tokens_per_second", r.tokens_per_second}, {"mfu", r.mfu},
                                       {"peak_bytes", r.peak_bytes}, {"rss_growth", r.rss_growth}}.dump().c_str());
    return 0;
  }
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  bench::print_peak(kernels::measure_machine_peak(0.3));
  std::stringstream list(flavors);
  while (std::getline(list, s.flavor, ',')) bench_flavor(s, torch);
  return 0;
}
