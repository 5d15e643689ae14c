// Lightning indexer kernels: top-k forward and the KL loss with its gradient (sparse stage with
// its target given per slot, dense warm-up recomputing the standard MLA target), GFLOP/s, fraction of this
// machine's measured peak for the precision, speedup over the reference twin, and the ratio to
// the same ops in eager PyTorch (reference/bench_dsa_indexer_torch.py, run in the same process
// tree when reference/.venv exists).
//
// FLOPs counted (docs/dsa.md section 8), summed over the causal rows, L_t = t + 1 keys for query t,
// k_t = min(K, L_t) selected:
//   top-k:       (2 HI DI + 2 HI) L_t        (head dot products; ReLU-weighted head sum)
//   sparse loss: (3 * 2 HI DI) k_t           (logits recomputed, dq, dk: docs/dsa.md 8's indexer-bwd
//                                             line). The target comes in per slot (sparse MLA
//                                             forward's head_mean, made in setup with the
//                                             absorbed MQA shapes H, D and not timed): its 2 H D
//                                             k_t reduction is sparse attention's work now
//   dense loss:  (3 * 2 HI DI) L_t + 2 H D L_t  (the same over every causal key, plus the target
//                                             recomputed from the main queries and keys)
// The selection itself, exp/log and the dense kernel's second pass over the logits (it computes
// them twice: lse first, then the gradients) are not counted. Top-k rows with L_t <= K select
// every key without scoring, so they count 0 (the S < K big-shape runs would otherwise report
// work never done).
// After each shape's top-k and sparse loss, a combined line: the sparse stage's indexer work per
// training step (forward + loss), the figure issue 5's 40% target names.
// Peak: f32 FMA for f32; the bf16 (AMX) peak for bf16. With AMX the bf16 kernels run the score
// and target products as tiles but the selection, softmax and the gradient products (f32 FMA)
// remain, so their fraction of that peak stays far below the f32 kernels' fraction of theirs.
//
//   bench_dsa_indexer [--seq S] [--big-seq S] [--only topk|sparse_loss|dense_loss] [--no-torch]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/sparse_mla.h"

using namespace titan;

namespace {

struct BenchShape {
  int64_t S, HI, DI, K, H, Hk, D;
};

enum class Op { topk, sparse_loss, dense_loss };
const char* op_name(Op op) { return op == Op::topk ? "topk" : op == Op::sparse_loss ? "sparse_loss" : "dense_loss"; }

struct Problem {
  BenchShape s;
  Op op;
  DType dtype;
  Tensor q, k, w, mq, mk, mlse, idx, target, dq, dk, dw;
  double scale;

  Problem(const BenchShape& shape, Op o, DType dt) : s(shape), op(o), dtype(dt), scale(1.0 / std::sqrt(double(shape.D))) {
    q = random_input({1, s.S, s.HI, s.DI}, dt, "q");
    k = random_input({1, s.S, s.DI}, dt, "k");
    w = random_input({1, s.S, s.HI}, DType::f32, "w");
    idx = Tensor::empty({1, s.S, s.K}, DType::i32);
    if (op == Op::topk) return;
    mq = random_input({1, s.S, s.H, s.D}, dt, "mq");
    mk = random_input({1, s.S, s.Hk, s.D}, dt, "mk");
    // Any finite lse: the work does not depend on the values.
    mlse = Tensor::full({1, s.S, s.H}, std::log(double(s.S)), DType::f32);
    dq = Tensor::empty(q.shape(), dt);
    dk = Tensor::empty(k.shape(), dt);
    dw = Tensor::empty(w.shape(), DType::f32);
    if (op != Op::sparse_loss) return;
    kernels::indexer_topk(idx, q, k, w);
    // The target as the model gets it: the sparse attention's head mean over its selected rows.
    Tensor att = Tensor::empty({1, s.S, s.H, s.D}, dt), lse = Tensor::empty({1, s.S, s.H}, DType::f32);
    target = Tensor::empty(idx.shape(), DType::f32);
    kernels::sparse_mla_forward(att, lse, mq, mk.view({1, s.S, s.D}), idx, s.D, scale, &target);
  }
  static Tensor random_input(const Shape& shape, DType dt, std::string_view name) {
    Tensor t = Tensor::empty(shape, DType::f32);
    init_uniform(t, 42, name, -1, 1);
    return t.to(dt);
  }
  void run() {
    if (op == Op::topk) {
      kernels::indexer_topk(idx, q, k, w);
    } else if (op == Op::sparse_loss) {
      kernels::indexer_kl_loss_sparse(dq, dk, dw, q, k, w, idx, target, 1.0);
    } else {
      kernels::indexer_kl_loss(dq, dk, dw, q, k, w, mq, mk, mlse, scale, 1.0);
    }
  }
  double flops() const {
    double f = 0;
    for (int64_t t = 0; t < s.S; ++t) {
      const double L = double(t + 1), kt = double(std::min(s.K, t + 1));
      if (op == Op::topk && t + 1 > s.K) f += (2.0 * s.HI * s.DI + 2.0 * s.HI) * L;
      if (op == Op::sparse_loss) f += 6.0 * s.HI * s.DI * kt;
      if (op == Op::dense_loss) f += (6.0 * s.HI * s.DI + 2.0 * s.H * s.D) * L;
    }
    return f;
  }
  std::string name() const {
    std::string n = std::string(op_name(op)) + " S=" + std::to_string(s.S) + " HI=" + std::to_string(s.HI) +
                    " DI=" + std::to_string(s.DI) + " K=" + std::to_string(s.K);
    if (op != Op::topk) n += " H=" + std::to_string(s.H) + " Hk=" + std::to_string(s.Hk) + " D=" + std::to_string(s.D);
    return n + " " + std::string(dtype_name(dtype));
  }
};

// Best seconds of the same op in eager PyTorch, or nothing without reference/.venv.
std::optional<double> torch_seconds(const Problem& p) {
  const char* py = "reference/.venv/bin/python";
  if (!std::filesystem::exists(py)) return std::nullopt;
  const BenchShape& s = p.s;
  const std::string cmd = std::string(py) + " reference/bench_dsa_indexer_torch.py --op " + op_name(p.op) +
                          " --seq " + std::to_string(s.S) + " --hi " + std::to_string(s.HI) + " --di " +
                          std::to_string(s.DI) + " --topk " + std::to_string(s.K) + " --heads " + std::to_string(s.H) +
                          " --hk " + std::to_string(s.Hk) + " --dim " + std::to_string(s.D) + " --dtype " +
                          (p.dtype == DType::f32 ? "float32" : "bfloat16") + " 2>/dev/null";
  const std::string out = bench::read_command(cmd);
  if (out.empty()) return std::nullopt;
  return nlohmann::json::parse(out.substr(out.rfind('{')))["seconds"].get<double>();
}

// One timed op: best seconds, FLOPs and (when run) PyTorch's seconds.
struct Timing {
  double seconds = 0, flops = 0;
  std::optional<double> torch_seconds;
};

// One result row: time, GFLOP/s and fraction of the precision's peak against the 40% target, and
// the ratio to PyTorch when it ran (else, with `say_missing`, why not).
void print_row(const std::string& name, DType dt, const kernels::MachinePeak& peak, const Timing& r, bool say_missing) {
  const double t = r.seconds, f = r.flops, pk = dt == DType::f32 ? peak.f32_flops : peak.bf16_flops;
  std::printf("%-70s %9.2f ms %8.1f GFLOP/s %5.1f%% of peak [%s vs 40%%]", name.c_str(), t * 1e3, f / t / 1e9,
              100 * f / t / pk, bench::verdict(f / t / pk, 0.4));
  if (const std::optional<double>& tt = r.torch_seconds) {
    std::printf("  torch %9.2f ms, ours %.1fx faster [%s vs 10x]", *tt * 1e3, *tt / t, bench::verdict(*tt / t, 10));
  } else if (say_missing) {
    std::printf("  torch: not run (no reference/.venv or it failed)");
  }
  std::printf("\n");
  std::fflush(stdout);
}

std::optional<Timing> run(const BenchShape& shape, Op op, DType dt, const kernels::MachinePeak& peak, bool torch,
                          const std::string& only) {
  if (!only.empty() && only != op_name(op)) return std::nullopt;
  Problem p(shape, op, dt);
  Timing r{bench::time_best([&] { p.run(); }, 3, 1), p.flops(), std::nullopt};
  if (torch) r.torch_seconds = torch_seconds(p);
  print_row(p.name(), dt, peak, r, torch);
  return r;
}

// The sparse stage's indexer work in one training step, forward (top-k) and loss with its
// gradients together, the way issue 5 states the target ("indexer forward + loss", as sparse
// attention's is forward + backward).
void print_sparse_stage(const BenchShape& s, DType dt, const kernels::MachinePeak& peak, const std::optional<Timing>& topk,
                        const std::optional<Timing>& loss) {
  if (!topk || !loss) return;
  Timing both{topk->seconds + loss->seconds, topk->flops + loss->flops, std::nullopt};
  if (topk->torch_seconds && loss->torch_seconds) both.torch_seconds = *topk->torch_seconds + *loss->torch_seconds;
  char name[128];
  std::snprintf(name, sizeof name, "  = indexer forward + loss, sparse stage S=%lld HI=%lld DI=%lld K=%lld %s",
                (long long)s.S, (long long)s.HI, (long long)s.DI, (long long)s.K, std::string(dtype_name(dt)).c_str());
  print_row(name, dt, peak, both, false);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t seq = 4096, big_seq = 4096;
  bool torch = true;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq" && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (a == "--big-seq" && i + 1 < argc) big_seq = std::atoll(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--no-torch") torch = false;
    else {
      std::fprintf(stderr, "usage: bench_dsa_indexer [--seq S] [--big-seq S] [--only OP] [--no-torch]\n");
      return 2;
    }
  }
  const kernels::MachinePeak peak = kernels::measure_machine_peak(0.5);
  bench::print_peak(peak);
  std::printf("threads: %d; CPU kernels: %s variant\n", num_threads(),
              std::string(cpu_capability_name(cpu_capability())).c_str());
  std::printf("FLOPs per docs/dsa.md section 8 (see the header of bench/bench_dsa_indexer.cpp); B = 1\n\n");

  // (a) the debug model: HI = 4, DI = 64, K = 256; sparse target absorbed (H = 16, D = 576,
  // Hk = 1), dense target standard MLA (D = 192, Hk = H). (b) a V3.2-sized indexer.
  const BenchShape debug_sparse{seq, 4, 64, 256, 16, 1, 576}, debug_dense{seq, 4, 64, 256, 16, 16, 192};
  const BenchShape big{big_seq, 64, 128, 2048, 16, 1, 576};
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::optional<Timing> topk = run(debug_sparse, Op::topk, dt, peak, torch, only);
    const std::optional<Timing> loss = run(debug_sparse, Op::sparse_loss, dt, peak, torch, only);
    print_sparse_stage(debug_sparse, dt, peak, topk, loss);
    run(debug_dense, Op::dense_loss, dt, peak, torch, only);
  }
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::optional<Timing> topk = run(big, Op::topk, dt, peak, torch, only);
    const std::optional<Timing> loss = run(big, Op::sparse_loss, dt, peak, torch, only);
    print_sparse_stage(big, dt, peak, topk, loss);
  }

  // Reference twin on a smaller shape (plain loops), same shape fast, as ratios.
  const BenchShape small{512, 4, 64, 64, 16, 1, 576};
  std::printf("\nfast vs reference at S = %lld, HI = 4, DI = 64, K = 64 (f32):\n", (long long)small.S);
  for (Op op : {Op::topk, Op::sparse_loss, Op::dense_loss}) {
    if (!only.empty() && only != op_name(op)) continue;
    Problem p(small, op, DType::f32);
    const double t_fast = bench::time_best([&] { p.run(); }, 3, 1);
    kernels::set_kernel_backend(kernels::KernelBackend::reference);
    const double t_ref = bench::time_best([&] { p.run(); }, 1, 0);
    kernels::set_kernel_backend(kernels::KernelBackend::fast);
    std::printf("  %-12s ref %9.2f ms, fast %8.3f ms, fast is %.0fx faster\n", op_name(op), t_ref * 1e3, t_fast * 1e3,
                t_ref / t_fast);
  }
  return 0;
}
