// Whole-model training throughput: the Llama-3 125M flavor at seq 1024 in f32 and bf16 (our
// tokens/s, MFU against the measured peak, peak memory), and, when reference/.venv has PyTorch,
// the same model in PyTorch eager and torch.compile on this machine, with the ratios.
//   build/bench/bench_train_step [--flavor 125M] [--batch 4] [--seq 1024] [--steps 3] [--no-torch]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bench_common.h"
#include "titan/autograd/ops.h"
#include "titan/core/rng.h"
#include "titan/models/llama3/model.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

using namespace titan;

namespace {

struct Result {
  double tokens_per_second = 0, mfu = 0;
  int64_t peak_bytes = 0;     // our allocator's peak (all tensors)
  int64_t rss_growth = 0;     // peak resident memory growth over the run, comparable with PyTorch's
};

Result run_ours_here(const models::llama3::Llama3Args& a, int64_t batch, int64_t seq, int steps, DType compute) {
  const int64_t rss0 = bench::max_rss_bytes();
  auto model = std::make_unique<models::llama3::Transformer>(a);
  model->init_parameters(0);
  model->set_compute_dtype(compute);
  optim::AdamW opt(model->named_parameters(), {});
  Tensor tokens = Tensor::empty({batch, seq}, DType::i32), targets = Tensor::empty({batch * seq}, DType::i32);
  Generator g(0);
  for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(a.vocab_size)));
  for (int64_t i = 0; i < targets.numel(); ++i) targets.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(a.vocab_size)));
  auto step = [&] {
    model->zero_grad();
    autograd::Variable loss = autograd::cross_entropy(model->forward(tokens), targets);
    autograd::backward(loss);
    const auto norm = optim::clip_grad_norm(model->named_parameters(), 1.0);
    opt.step(1e-4f, norm.scale);
  };
  memory_reset_peak();
  const double best = bench::time_best(step, steps, 1);
  const auto peak = kernels::measure_machine_peak(0.3);
  Result r;
  r.tokens_per_second = double(batch * seq) / best;
  r.mfu = a.training_flops_per_token(seq) * r.tokens_per_second / (compute == DType::bf16 ? peak.bf16_flops : peak.f32_flops);
  r.peak_bytes = memory_stats().peak_total;
  r.rss_growth = bench::max_rss_bytes() - rss0;
  return r;
}

// Each configuration runs in a fresh process (this binary with --child), so its resident-memory
// high-water mark is its own. (fork() would inherit OpenMP's thread pool, which libgomp does not
// support in the child.)
std::string g_self;
std::string g_child_args;

Result run_ours(DType compute) {
  const std::string out = bench::read_command(g_self + " --child " + (compute == DType::bf16 ? "bf16" : "f32") + g_child_args);
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

std::optional<nlohmann::json> run_torch(const models::llama3::Llama3Args& a, int64_t batch, int64_t seq, int steps,
                                        const char* dtype, const char* mode) {
  const char* py = "reference/.venv/bin/python";
  if (!std::filesystem::exists(py)) return std::nullopt;
  const std::string cmd = std::string(py) + " reference/bench_llama3_torch.py --dim " + std::to_string(a.dim) +
                          " --layers " + std::to_string(a.n_layers) + " --heads " + std::to_string(a.n_heads) +
                          " --vocab " + std::to_string(a.vocab_size) + " --batch " + std::to_string(batch) +
                          " --seq " + std::to_string(seq) + " --steps " + std::to_string(steps) + " --dtype " + dtype +
                          " --mode " + mode + " 2>/dev/null";
  const std::string out = bench::read_command(cmd);
  if (out.empty()) return std::nullopt;
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

}  // namespace

int main(int argc, char** argv) {
  std::string flavor = "125M";
  int64_t batch = 4, seq = 1024;
  int steps = 3;
  bool torch = true;
  std::string child;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--child" && i + 1 < argc) {
      child = argv[++i];
      continue;
    }
    if (a == "--flavor" && i + 1 < argc) flavor = argv[++i];
    else if (a == "--batch" && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (a == "--seq" && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--no-torch") torch = false;
  }
  auto args = models::llama3::llama3_flavor(flavor, 2048);
  args.max_seq_len = std::max(args.max_seq_len, seq);
  if (!child.empty()) {
    const Result r = run_ours_here(args, batch, seq, steps, child == "bf16" ? DType::bf16 : DType::f32);
    std::printf("%s\n", nlohmann::json{{"tokens_per_second", r.tokens_per_second}, {"mfu", r.mfu},
                                       {"peak_bytes", r.peak_bytes}, {"rss_growth", r.rss_growth}}.dump().c_str());
    return 0;
  }
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  g_child_args = " --flavor " + flavor + " --batch " + std::to_string(batch) + " --seq " + std::to_string(seq) +
                 " --steps " + std::to_string(steps);
  bench::print_peak(kernels::measure_machine_peak(0.3));
  std::printf("llama3 %s: %.1fM parameters, batch %lld x seq %lld, %.2f GFLOP/token (TorchTitan's count)\n",
              flavor.c_str(), double(args.num_parameters()) / 1e6, static_cast<long long>(batch),
              static_cast<long long>(seq), args.training_flops_per_token(seq) / 1e9);
  const Result f32 = run_ours(DType::f32);
  const Result bf = run_ours(DType::bf16);
  std::printf("titan f32 : %8.0f tok/s  MFU %5.1f%%  tensors peak %s, RSS growth %s\n", f32.tokens_per_second,
              100 * f32.mfu, train::format_bytes(double(f32.peak_bytes)).c_str(),
              train::format_bytes(double(f32.rss_growth)).c_str());
  std::printf("titan bf16: %8.0f tok/s  MFU %5.1f%%  tensors peak %s, RSS growth %s   [%s bf16 MFU >= 40%%]\n",
              bf.tokens_per_second, 100 * bf.mfu, train::format_bytes(double(bf.peak_bytes)).c_str(),
              train::format_bytes(double(bf.rss_growth)).c_str(), bench::verdict(bf.mfu, 0.40));
  if (!torch) return 0;
  for (const char* dtype : {"float32", "bfloat16"}) {
    const Result& ours = std::string(dtype) == "float32" ? f32 : bf;
    for (const char* mode : {"eager", "compile"}) {
      const auto t = run_torch(args, batch, seq, steps, dtype, mode);
      if (!t) {
        std::printf("pytorch %s %s: not run (reference/.venv with torch missing, or it failed)\n", mode, dtype);
        continue;
      }
      const double tps = (*t)["tokens_per_second"];
      const double rss = double((*t)["peak_rss_bytes"].get<int64_t>() - (*t)["rss_before_bytes"].get<int64_t>());
      std::printf("pytorch %-7s %-8s: %8.0f tok/s, training memory (RSS growth) %s -> titan/pytorch tokens/s %.2fx%s, "
                  "memory (RSS growth) %.2fx\n",
                  mode, dtype, tps, train::format_bytes(rss).c_str(), ours.tokens_per_second / tps,
                  std::string(mode) == "eager" ? (ours.tokens_per_second / tps >= 1.5 ? " [PASS >= 1.5x]" : " [MISS >= 1.5x]") : "",
                  double(ours.rss_growth) / rss);
    }
  }
  return 0;
}
