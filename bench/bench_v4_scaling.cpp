// DeepSeek-V4's long-context cost on one rank (issue 37, "Speed and memory"): the deepseek_v4
// debugmodel's f32 training step (forward with the CSA indexers' KL loss at its default coeff
// 0.01, backward, clipping, AdamW) at batch 1 and seq 4096 .. 32768, printed as time per token and
// the ratio of the longest to the shortest (target <= 1.3x: compression keeps attention
// near-linear), and our tensors' peak memory at each length. Beside it, the deepseek_v32
// debugmodel (DSA's fused kernels, sparse stage, as bench_dsa_model runs it) at the lengths of
// --v32-seqs, for its memory at the same size: in f32 as V4, and where f32 fails (out of memory),
// in bf16 mixed precision (bench_dsa_model's long-context dtype) instead. 16K by default: V3.2's
// f32 step at 32K needs about 25 GiB of tensors (12.4 GiB at 16K), more than a 23 GiB machine has
// (the kernel killed it), and its bf16 step there takes minutes on two cores (--v32-seqs 32768).
//
// Where V4 is not linear: each HCA layer attends to every causally visible entry (one per
// hca_ratio = 16 tokens, S / 32 on average), and each CSA layer's lightning indexer scores every
// visible compressed entry (S / 8 on average) before taking its top-k. Both grow with S per token.
//
// The arithmetic printed beside the times: the model's own count (TorchTitan's: 6 per active
// weight, plus the attention's scores and values over the window, CSA's top-k and HCA's visible
// entries) and the CSA indexers' scoring of every visible compressed entry, which that count leaves
// out (forward only: 2 nI dI per entry; the KL's gradient reaches only the top-k).
//
// Each configuration runs in a fresh process (this binary with --child), so the resident-memory
// high-water mark is its own. One warm-up step, then the best of 4 timed steps (2 from 16K on):
// the VM is shared, and a single short step is easily disturbed.
//   build/bench/bench_v4_scaling [--seqs 4096,8192,16384,32768] [--v32-seqs 16384] [--skip-v32]
//                                [--flavor debugmodel_long (the same widths, V4-Flash's attention schedule)]
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
#include "titan/core/cpu_features.h"
#include "titan/core/rng.h"
#include "titan/models/causal_lm.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

using namespace titan;

namespace {

constexpr int64_t kVocab = 2048;  // the main job's tokenizer

struct Result {
  bool ok = false;
  int64_t seq = 0;
  DType compute = DType::f32;
  double seconds_per_step = 0;
  int64_t peak_bytes = 0;  // our allocator's peak over all tensors
  int64_t rss_growth = 0;  // resident-memory high-water growth over the run
  double flops_per_token = 0;  // the model's count (deepseek_v4 only: + the indexers' scoring)
  double per_token() const { return seconds_per_step / double(seq); }
};

// The CSA indexers' scoring per token at seq: each query scores its visible compressed entries
// ((s + 1) / m of them, S / (2 m) on average) with nI heads of dI dims, forward only.
std::string g_flavor = "debugmodel";  // --flavor: deepseek_v4's (debugmodel_long: V4-Flash's attention schedule)

double indexer_flops_per_token(int64_t seq) {
  const auto a = models::deepseek_v4::deepseek_v4_flavor(g_flavor, kVocab);
  double layers = 0;
  for (auto t : a.layer_types) layers += t == models::deepseek_v4::LayerType::csa ? 1 : 0;
  return layers * 2.0 * double(a.index_n_heads * a.index_head_dim) * double(seq / a.csa_ratio) / 2;
}

// One model at one length, in this process. model: deepseek_v4 or deepseek_v32 (f32 or bf16).
Result run_here(const std::string& model_name, int64_t seq, DType compute) {
  const int64_t rss0 = bench::max_rss_bytes();
  flush_denormals(true);  // as the trainer does
  models::ModelOptions options;  // [dsa] defaults: V4's indexer KL at 0.01; V3.2 sparse from step 1
  if (model_name == "deepseek_v32") options.converters = {"dsa_fused"};
  auto model = models::build_model(model_name, model_name == "deepseek_v4" ? g_flavor : "debugmodel", kVocab, seq, options);
  model->init_parameters(0);
  model->set_compute_dtype(compute);
  // V4's hash layers start from a balanced tid2eid (models/moe/moe.h), as bench_train_step's.
  model->begin_step(1);
  bench::TrainingStep step(*model, 1, seq, kVocab);
  memory_reset_peak();
  Result out;
  out.ok = true;
  out.seq = seq;
  out.seconds_per_step = bench::time_best([&] { step(); }, seq >= 16384 ? 2 : 4, 1);
  out.peak_bytes = memory_stats().peak_total;
  out.rss_growth = bench::max_rss_bytes() - rss0;
  out.flops_per_token = model->training_flops_per_token(seq);
  if (model_name == "deepseek_v4") out.flops_per_token += indexer_flops_per_token(seq);
  return out;
}

std::string g_self;

Result run(const std::string& model_name, int64_t seq, DType compute = DType::f32) {
  const std::string out = bench::read_command(g_self + " --flavor " + g_flavor + " --child " + model_name + " " +
                                              std::to_string(seq) + " " + std::string(dtype_name(compute)));
  Result r;
  if (out.empty() || out.rfind('{') == std::string::npos) return r;
  const auto j = nlohmann::json::parse(out.substr(out.rfind('{')));
  r.ok = true;
  r.seq = seq;
  r.compute = compute;
  r.seconds_per_step = j["seconds_per_step"];
  r.peak_bytes = j["peak_bytes"];
  r.rss_growth = j["rss_growth"];
  r.flops_per_token = j["flops_per_token"];
  return r;
}

std::string describe(const Result& r) {
  if (!r.ok) return "failed (out of memory or an error; run the --child command by hand to see it)";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%7.2f s/step  %8.1f tok/s  %7.3f ms/token  %6.2f MFLOP/token  tensors peak %10s  RSS growth %10s",
                r.seconds_per_step, double(r.seq) / r.seconds_per_step, 1e3 * r.per_token(), r.flops_per_token / 1e6,
                train::format_bytes(double(r.peak_bytes)).c_str(), train::format_bytes(double(r.rss_growth)).c_str());
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqs = {4096, 8192, 16384, 32768};
  std::vector<int64_t> v32_seqs = {16384};
  bool v32 = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--flavor" && i + 1 < argc) {
      g_flavor = argv[++i];
      continue;
    }
    if (a == "--child" && i + 3 < argc) {
      const Result r = run_here(argv[i + 1], std::atoll(argv[i + 2]),
                                std::string(argv[i + 3]) == "bf16" ? DType::bf16 : DType::f32);
      std::printf("%s\n", nlohmann::json{{"seconds_per_step", r.seconds_per_step},
                                         {"peak_bytes", r.peak_bytes},
                                         {"rss_growth", r.rss_growth},
                                         {"flops_per_token", r.flops_per_token}}
                              .dump()
                              .c_str());
      return 0;
    }
    if (a == "--seqs" && i + 1 < argc) seqs = bench::parse_list(argv[++i]);
    else if (a == "--v32-seqs" && i + 1 < argc) v32_seqs = bench::parse_list(argv[++i]);
    else if (a == "--skip-v32") v32 = false;
  }
  TITAN_CHECK(!seqs.empty(), "bench_v4_scaling: --seqs is empty", "pass lengths such as --seqs 4096,32768");
  g_self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::printf("deepseek_v4 %s, f32, batch 1, one training step (indexer KL loss at coeff 0.01, backward, "
              "clip, AdamW); 1 warm-up step, best of 4 timed (2 from 16K on)\n",
              g_flavor.c_str());
  std::vector<Result> v4;
  for (int64_t s : seqs) {
    v4.push_back(run("deepseek_v4", s));
    std::printf("  deepseek_v4  seq %6lld: %s\n", static_cast<long long>(s), describe(v4.back()).c_str());
    std::fflush(stdout);
  }
  const Result* first = nullptr;
  const Result* last = nullptr;
  for (const Result& r : v4) {
    if (!r.ok) continue;
    if (!first) first = &r;
    last = &r;
  }
  if (first && last && last != first) {
    const double growth = last->per_token() / first->per_token();
    std::printf("  time per token grows %.2fx from seq %lld to %lld [%s <= 1.3x]; FLOPs per token (with the "
                "indexers' scoring) %.2fx\n",
                growth, static_cast<long long>(first->seq), static_cast<long long>(last->seq),
                growth <= 1.3 ? "PASS" : "MISS", last->flops_per_token / first->flops_per_token);
  }
  if (!v32) return 0;
  for (int64_t s : v32_seqs) {
    Result r32 = run("deepseek_v32", s);
    if (!r32.ok) {
      std::printf("  deepseek_v32 seq %6lld: f32 failed (out of memory here?); bf16 mixed precision instead\n",
                  static_cast<long long>(s));
      r32 = run("deepseek_v32", s, DType::bf16);
    }
    std::printf("  deepseek_v32 seq %6lld: %s   (DSA fused, sparse stage, %s)\n", static_cast<long long>(s),
                describe(r32).c_str(), std::string(dtype_name(r32.compute)).c_str());
    std::fflush(stdout);
    for (const Result& r : v4)
      if (r.ok && r32.ok && r.seq == r32.seq)
        std::printf("  seq %lld: deepseek_v4 (f32) / deepseek_v32 (%s) tensors peak %.2fx, RSS growth %.2fx, "
                    "time per token %.2fx\n",
                    static_cast<long long>(r.seq), std::string(dtype_name(r32.compute)).c_str(),
                    double(r.peak_bytes) / double(r32.peak_bytes), double(r.rss_growth) / double(r32.rss_growth),
                    r.per_token() / r32.per_token());
  }
  return 0;
}
