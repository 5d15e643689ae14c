// Sparse MLA attention (absorbed MQA form), forward and backward: GFLOP/s, fraction of this
// machine's measured peak for the precision, speedup over the reference twin, and (when
// reference/.venv has PyTorch) the ratio to the same op in PyTorch eager, measured in this run.
//
// FLOPs (docs/dsa.md section 8), per query token and counting only its valid slots k_eff:
//   forward  2 H k_eff (Dqk + Dv)       scores q kv^T over all Dqk dims, then P kv[:, :Dv]
//   backward 2 H k_eff (3 Dqk + 2 Dv)   scores recomputed, dO kv[:, :Dv]^T, dS kv (dq), dS^T q and
//                                       P^T dO (dkv)
// exp, the softmax bookkeeping, the gathers and the dkv scatter-add are not counted. The forward
// is also timed with the optional head_mean output (the indexer's KL target), for information.
//
//   build/bench/bench_sparse_mla [--seq 4096] [--reps 3] [--big] [--no-torch]
// Shape (a) is the debug model's (B=1, S=4096, H=16, Dqk=576, Dv=512, K=256). --big adds (b),
// S=4096, H=64, K=2048: about 3 TFLOP per fwd+bwd (6.3M valid slots), seconds only on a
// many-core machine.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/sparse_mla.h"

using namespace titan;

namespace {

struct Problem {
  int64_t S, H, Dqk, Dv, K;
  DType dtype;
  double scale;
  Tensor q, kv, idx, dout, o, lse, dq, dkv, head_mean;
  int64_t valid_slots = 0;

  Problem(int64_t s, int64_t h, int64_t dqk, int64_t dv, int64_t k, DType dt)
      : S(s), H(h), Dqk(dqk), Dv(dv), K(k), dtype(dt), scale(1.0 / std::sqrt(double(dqk))) {
    q = random_input({1, S, H, Dqk}, "q");
    kv = random_input({1, S, Dqk}, "kv");
    dout = random_input({1, S, H, Dv}, "dout");
    o = Tensor::empty({1, S, H, Dv}, dtype);
    lse = Tensor::empty({1, S, H}, DType::f32);
    head_mean = Tensor::empty({1, S, K}, DType::f32);
    dq = Tensor::empty(q.shape(), dtype);
    dkv = Tensor::empty(kv.shape(), dtype);
    // Causal top-k rows: query t selects min(K, t + 1) distinct keys of [0, t] at random, then -1.
    idx = Tensor::empty({1, S, K}, DType::i32);
    Generator g(42, "idx");
    std::vector<int32_t> pool;
    for (int64_t t = 0; t < S; ++t) {
      pool.resize(size_t(t + 1));
      std::iota(pool.begin(), pool.end(), 0);
      int32_t* row = idx.data<int32_t>() + t * K;
      for (int64_t j = 0; j < K; ++j) {
        if (j <= t) {
          std::swap(pool[size_t(j)], pool[size_t(j + int64_t(g.next_below(uint64_t(t + 1 - j))))]);
          row[j] = pool[size_t(j)];
          ++valid_slots;
        } else {
          row[j] = -1;
        }
      }
    }
  }
  Tensor random_input(const Shape& shape, std::string_view name) const {
    Tensor t = Tensor::empty(shape, DType::f32);
    init_uniform(t, 42, name, -1, 1);
    return t.to(dtype);
  }
  double forward_flops() const { return 2.0 * double(H) * double(valid_slots) * double(Dqk + Dv); }
  double backward_flops() const { return 2.0 * double(H) * double(valid_slots) * double(3 * Dqk + 2 * Dv); }
  void forward(bool with_head_mean = false) {
    kernels::sparse_mla_forward(o, lse, q, kv, idx, Dv, scale, with_head_mean ? &head_mean : nullptr);
  }
  void backward() { kernels::sparse_mla_backward(dq, dkv, dout, q, kv, idx, o, lse, scale); }
  std::string name() const {
    return "S=" + std::to_string(S) + " H=" + std::to_string(H) + " Dqk=" + std::to_string(Dqk) + " Dv=" +
           std::to_string(Dv) + " K=" + std::to_string(K) + " " + std::string(dtype_name(dtype));
  }
};

// The same op in PyTorch eager (reference/bench_sparse_mla_torch.py): {fwd_s, fwd_bwd_s}.
std::optional<nlohmann::json> run_torch(const Problem& p, int reps) {
  const char* py = "reference/.venv/bin/python";
  if (!std::filesystem::exists(py)) return std::nullopt;
  // Query chunks that keep PyTorch's gathered [chunk, K, Dqk] rows near 1 GiB.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(p.S, (int64_t(1) << 30) / (p.K * p.Dqk * 4)));
  const std::string cmd = std::string(py) + " reference/bench_sparse_mla_torch.py --seq " + std::to_string(p.S) +
                          " --heads " + std::to_string(p.H) + " --dqk " + std::to_string(p.Dqk) + " --dv " +
                          std::to_string(p.Dv) + " --topk " + std::to_string(p.K) + " --dtype " +
                          (p.dtype == DType::f32 ? "float32" : "bfloat16") + " --reps " + std::to_string(reps) +
                          " --chunk " + std::to_string(chunk) + " 2>/dev/null";
  const std::string out = bench::read_command(cmd);
  if (out.empty()) return std::nullopt;
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

void run(Problem& p, const kernels::MachinePeak& machine, int reps, bool torch) {
  const double peak = p.dtype == DType::f32 ? machine.f32_flops : machine.bf16_flops;
  const double t_fwd = bench::time_best([&] { p.forward(); }, reps, 1);
  const double t_bwd = bench::time_best([&] { p.backward(); }, reps, 1);
  const double f = p.forward_flops(), b = p.backward_flops(), frac = (f + b) / (t_fwd + t_bwd) / peak;
  std::printf("%s (%.1f%% of slots valid)\n", p.name().c_str(), 100.0 * double(p.valid_slots) / double(p.S * p.K));
  std::printf("  fwd     %9.2f ms  %7.1f GFLOP/s  %5.1f%% of peak\n", t_fwd * 1e3, f / t_fwd / 1e9,
              100 * f / t_fwd / peak);
  std::printf("  bwd     %9.2f ms  %7.1f GFLOP/s  %5.1f%% of peak\n", t_bwd * 1e3, b / t_bwd / 1e9,
              100 * b / t_bwd / peak);
  // For information: the forward that also writes the indexer's target (head_mean, H adds per slot).
  const double t_hm = bench::time_best([&] { p.forward(true); }, reps, 1);
  std::printf("  fwd with head_mean %9.2f ms (%.3fx the plain forward)\n", t_hm * 1e3, t_hm / t_fwd);
  std::printf("  fwd+bwd %9.2f ms  %7.1f GFLOP/s  %5.1f%% of peak  [%s vs 40%%]\n", (t_fwd + t_bwd) * 1e3,
              (f + b) / (t_fwd + t_bwd) / 1e9, 100 * frac, bench::verdict(frac, 0.4));
  if (!torch) return;
  const auto t = run_torch(p, reps);
  if (!t) {
    std::printf("  pytorch eager: not run (reference/.venv with torch missing, or it failed)\n");
    return;
  }
  const double tf = (*t)["fwd_s"], tb = (*t)["fwd_bwd_s"];
  const double ratio = tb / (t_fwd + t_bwd);
  std::printf("  pytorch eager (%d threads): fwd %.2f ms, fwd+bwd %.2f ms -> titan is %.1fx faster fwd, %.1fx "
              "fwd+bwd  [%s vs 10x]\n",
              (*t)["threads"].get<int>(), tf * 1e3, tb * 1e3, tf / t_fwd, ratio, bench::verdict(ratio, 10));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seq = 4096;
  int reps = 3;
  bool big = false, torch = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq" && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--big") big = true;
    else if (a == "--no-torch") torch = false;
  }
  const kernels::MachinePeak peak = kernels::measure_machine_peak(0.5);
  bench::print_peak(peak);
  std::printf("threads: %d; CPU kernels: %s variant\n", num_threads(),
              std::string(cpu_capability_name(cpu_capability())).c_str());
  std::printf("FLOPs per query token over its valid slots k_eff: fwd 2 H k_eff (Dqk + Dv), bwd 2 H k_eff "
              "(3 Dqk + 2 Dv);\npeak: f32 FMA for f32, the faster of AVX512_BF16 and AMX for bf16; best of %d\n\n",
              reps);

  struct Shape5 { int64_t S, H, Dqk, Dv, K; };
  std::vector<Shape5> shapes = {{seq, 16, 576, 512, 256}};  // (a) the debug model's layer
  if (big) shapes.push_back({seq, 64, 576, 512, 2048});      // (b) full-scale top-k
  for (const Shape5& s : shapes) {
    for (DType dt : {DType::f32, DType::bf16}) {
      Problem p(s.S, s.H, s.Dqk, s.Dv, s.K, dt);
      run(p, peak, reps, torch);
    }
  }

  // The reference twin is a scalar loop: compare on a smaller problem, same shape fast.
  Problem small(256, 16, 576, 512, 64, DType::f32);
  const double t_fast = bench::time_best([&] { small.forward(); small.backward(); }, 3, 1);
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  const double t_ref = bench::time_best([&] { small.forward(); small.backward(); }, 1, 0);
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  std::printf("\nreference vs fast, %s fwd+bwd: ref %.1f ms, fast %.2f ms, fast is %.0fx faster\n",
              small.name().c_str(), t_ref * 1e3, t_fast * 1e3, t_ref / t_fast);
  return 0;
}
