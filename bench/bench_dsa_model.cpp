// Whole-model DeepSeek-V3.2 training with DeepSeek Sparse Attention (the deepseek_v32 debugmodel):
// 1. fused DSA kernels vs the small-op path (`[model] converters`) at seq 4096, both stages:
//    tokens/s and peak memory, ratios from one run (targets: >= 3x tokens/s, <= 0.5x memory);
// 2. long context, in bf16 mixed precision as long-context training runs: time per token of the
//    fused sparse stage at 4k .. 32k (and peak memory: 32k must fit in 16 GiB), against dense MLA attention (the deepseek_v3 debugmodel: the same
//    blocks without an indexer or a query latent) at lengths where dense finishes in reasonable time.
// Each configuration runs in a fresh process (this binary with --child), so the resident-memory
// high-water mark is its own.
//   build/bench/bench_dsa_model [--seq 4096] [--long 4096,8192,16384,32768] [--dense 4096,8192]
//                               [--skip-compare] [--long-dtype bf16|f32]
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_training.h"
#include "titan/autograd/ops.h"
#include "titan/core/allocator.h"
#include "titan/core/rng.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

using namespace titan;
using models::deepseek_v3::DsaImpl;
using models::deepseek_v3::DsaStage;

namespace {

constexpr int64_t kVocab = 2048;  // the main job's tokenizer

struct Run {
  std::string model = "deepseek_v32";  // or deepseek_v3 (dense MLA)
  DsaImpl impl = DsaImpl::fused;
  DsaStage stage = DsaStage::sparse;
  int64_t seq = 4096;
  DType compute = DType::f32;  // bf16: mixed precision (bf16 activations and GEMMs, f32 masters)
};

struct Result {
  bool ok = false;
  double seconds_per_step = 0;
  int64_t seq = 0;
  int64_t peak_bytes = 0;  // our allocator's peak over all tensors
  int64_t rss_growth = 0;  // resident-memory high-water growth over the run
};

Result run_here(const Run& r) {
  const int64_t rss0 = bench::max_rss_bytes();
  // The DSA stage and kernels as the trainer sets them: [dsa] warmup_steps and model.converters.
  models::ModelOptions options;
  if (r.model == "deepseek_v32") {
    if (r.impl == DsaImpl::fused) options.converters = {"dsa_fused"};
    if (r.stage == DsaStage::dense_warmup) options.dsa.warmup_steps = 1;
  }
  auto model = models::build_model(r.model, "debugmodel", kVocab, r.seq, options);
  model->init_parameters(0);
  model->set_compute_dtype(r.compute);
  model->begin_step(1);
  bench::TrainingStep step(*model, 1, r.seq, kVocab);
  memory_reset_peak();
  Result out;
  out.ok = true;
  out.seq = r.seq;
  out.seconds_per_step = bench::time_best([&] { step(); }, r.seq >= 16384 ? 1 : 2, 1);
  out.peak_bytes = memory_stats().peak_total;
  out.rss_growth = bench::max_rss_bytes() - rss0;
  return out;
}

std::string g_self;

const char* impl_name(DsaImpl i) { return i == DsaImpl::fused ? "fused" : "small_ops"; }
const char* stage_name(DsaStage s) { return s == DsaStage::sparse ? "sparse" : "dense_warmup"; }

Result run(const Run& r) {
  const std::string cmd = g_self + " --child " + r.model + " " + impl_name(r.impl) + " " + stage_name(r.stage) + " " +
                          std::to_string(r.seq) + " " + std::string(dtype_name(r.compute));
  const std::string out = bench::read_command(cmd);
  Result res;
  if (out.empty() || out.rfind('{') == std::string::npos) return res;
  const auto j = nlohmann::json::parse(out.substr(out.rfind('{')));
  res.ok = true;
  res.seq = r.seq;
  res.seconds_per_step = j["seconds_per_step"];
  res.peak_bytes = j["peak_bytes"];
  res.rss_growth = j["rss_growth"];
  return res;
}

std::string describe(const Result& r) {
  if (!r.ok) return "failed (out of memory or an error; run the --child command by hand to see it)";
  char buf[256];
  std::snprintf(buf, sizeof buf, "%8.1f tok/s  %7.3f ms/token  tensors peak %9s  RSS growth %9s",
                double(r.seq) / r.seconds_per_step, 1e3 * r.seconds_per_step / double(r.seq),
                train::format_bytes(double(r.peak_bytes)).c_str(), train::format_bytes(double(r.rss_growth)).c_str());
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seq = 4096;
  std::vector<int64_t> long_seqs = {4096, 8192, 16384, 32768}, dense_seqs = {4096, 8192};
  bool compare = true;
  DType long_dtype = DType::bf16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--child" && i + 5 < argc) {
      Run r;
      r.model = argv[i + 1];
      r.impl = std::string(argv[i + 2]) == "fused" ? DsaImpl::fused : DsaImpl::small_ops;
      r.stage = std::string(argv[i + 3]) == "sparse" ? DsaStage::sparse : DsaStage::dense_warmup;
      r.seq = std::atoll(argv[i + 4]);
      r.compute = std::string(argv[i + 5]) == "bf16" ? DType::bf16 : DType::f32;
      const Result res = run_here(r);
      std::printf("%s\n", nlohmann::json{{"seconds_per_step", res.seconds_per_step},
                                         {"peak_bytes", res.peak_bytes},
                                         {"rss_growth", res.rss_growth}}
                              .dump()
                              .c_str());
      return 0;
    }
    if (a == "--seq" && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (a == "--long" && i + 1 < argc) long_seqs = bench::parse_list(argv[++i]);
    else if (a == "--dense" && i + 1 < argc) dense_seqs = bench::parse_list(argv[++i]);
    else if (a == "--skip-compare") compare = false;
    else if (a == "--long-dtype" && i + 1 < argc) long_dtype = std::string(argv[++i]) == "f32" ? DType::f32 : DType::bf16;
  }
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::printf("deepseek_v32 debugmodel, batch 1, one full training step (forward, backward, AdamW)\n");

  if (compare) std::printf("\n1. fused DSA kernels vs small ops at seq %lld, f32\n", static_cast<long long>(seq));
  for (DsaStage stage : {DsaStage::sparse, DsaStage::dense_warmup}) {
    if (!compare) break;
    const Result fused = run({"deepseek_v32", DsaImpl::fused, stage, seq});
    const Result small = run({"deepseek_v32", DsaImpl::small_ops, stage, seq});
    std::printf("  %-12s fused    : %s\n", stage_name(stage), describe(fused).c_str());
    std::printf("  %-12s small ops: %s\n", stage_name(stage), describe(small).c_str());
    if (fused.ok && small.ok) {
      const double speed = small.seconds_per_step / fused.seconds_per_step;
      const double mem = double(fused.rss_growth) / double(small.rss_growth);
      const double tensors = double(fused.peak_bytes) / double(small.peak_bytes);
      std::printf("  %-12s fused/small ops: tokens/s %.2fx%s, RSS growth %.2fx, tensors peak %.2fx%s\n",
                  stage_name(stage), speed, stage == DsaStage::sparse ? (speed >= 3 ? " [PASS >= 3x]" : " [MISS >= 3x]") : "",
                  mem, tensors, stage == DsaStage::sparse ? (tensors <= 0.5 ? " [PASS <= 0.5x]" : " [MISS <= 0.5x]") : "");
    }
  }

  std::printf("\n2. long context, %s: fused sparse stage vs dense MLA (deepseek_v3 debugmodel)\n",
              std::string(dtype_name(long_dtype)).c_str());
  std::vector<Result> sparse, dense;
  for (int64_t s : long_seqs) {
    sparse.push_back(run({"deepseek_v32", DsaImpl::fused, DsaStage::sparse, s, long_dtype}));
    std::printf("  seq %6lld  DSA sparse : %s%s\n", static_cast<long long>(s), describe(sparse.back()).c_str(),
                s == 32768 && sparse.back().ok
                    ? (sparse.back().rss_growth <= (int64_t(16) << 30) ? "  [PASS fits 16 GiB]" : "  [MISS fits 16 GiB]")
                    : "");
  }
  for (int64_t s : dense_seqs) {
    dense.push_back(run({"deepseek_v3", DsaImpl::fused, DsaStage::sparse, s, long_dtype}));
    std::printf("  seq %6lld  dense MLA  : %s\n", static_cast<long long>(s), describe(dense.back()).c_str());
  }
  auto per_token = [](const Result& r) { return r.seconds_per_step / double(r.seq); };
  if (sparse.size() >= 2 && sparse.front().ok && sparse.back().ok)
    std::printf("  time per token grows %.2fx from seq %lld to %lld with DSA\n",
                per_token(sparse.back()) / per_token(sparse.front()), static_cast<long long>(sparse.front().seq),
                static_cast<long long>(sparse.back().seq));
  if (dense.size() >= 2 && dense.front().ok && dense.back().ok)
    std::printf("  time per token grows %.2fx from seq %lld to %lld with dense MLA\n",
                per_token(dense.back()) / per_token(dense.front()), static_cast<long long>(dense.front().seq),
                static_cast<long long>(dense.back().seq));
  for (size_t i = 0; i < dense.size() && i < sparse.size(); ++i)
    if (dense[i].ok && sparse[i].ok && dense[i].seq == sparse[i].seq)
      std::printf("  seq %6lld: DSA / dense time per token %.2f\n", static_cast<long long>(dense[i].seq),
                  per_token(sparse[i]) / per_token(dense[i]));
  return 0;
}
