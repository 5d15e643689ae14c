// DeepSeek-V4's attention over [window | compressed entries | sink]: the fused op
// (autograd::v4_attention, kernels/v4_attention.h) against its small-op form (transformers' eager
// attention: [B, H, S, S + T] masked scores; autograd::v4_attention_small_ops), forward +
// backward, time and the peak of tensor memory above what was live before, for a CSA layer
// (top-k compressed entries) and an HCA layer (every visible entry) at a debug-model shape and at
// 4K tokens (--flash adds the fused kernels alone at V4-Flash's 64 heads of 512; --long the
// kernels alone at the debugmodel_long flavor's 4 heads of 64 and V4-Flash's window and ratios,
// at 4K and 32K tokens: the long-context benchmark's attention). The pairs in f32; the kernels
// alone in f32 and bf16. Ratios from this run.
// --only NAME runs the one shape of that layer name (e.g. --only "32K CSA h4"), for a profiler.
//   build/bench/bench_v4_attention [--reps 3] [--skip-4k] [--flash] [--long] [--only NAME]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "bench_common.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/core/allocator.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/v4_attention.h"
#include "titan/kernels/v4_attention_params.h"
#include "titan/train/metrics.h"

using namespace titan;
using autograd::Variable;

namespace {

struct Shape4 {
  const char* name;
  int64_t B, S, H, D, W, m, K;  // K = 0: HCA
};

// The fused kernels alone at one shape.
struct KernelRow {
  const char* name;
  double keys_per_query;
  double fwd_ms, bwd_ms, fwd_gflops, bwd_gflops;              // f32
  double fwd16_ms, bwd16_ms, fwd16_gflops, bwd16_gflops;      // bf16
};
std::vector<KernelRow> kernel_rows;

struct Measure {
  double seconds = 0;
  int64_t peak_bytes = 0;  // tensor memory above what was live before
};

Measure measure(const std::function<void()>& fn, int reps) {
  Measure m;
  m.seconds = bench::time_best(fn, reps, 1);
  const int64_t live = memory_stats().live_total;
  memory_reset_peak();
  fn();
  m.peak_bytes = memory_stats().peak_total - live;
  return m;
}

Tensor uniform(const titan::Shape& s, uint64_t seed, const char* name, double lo = -1, double hi = 1) {
  Tensor t = Tensor::empty(s, DType::f32);
  init_uniform(t, seed, name, lo, hi);
  return t;
}

// CSA's slot lists as the indexer's top-k gives them: min(K, visible) distinct visible entries
// per query, the other slots -1.
Tensor top_k_like(const kernels::V4AttentionParams& d) {
  Tensor idx = Tensor::empty({d.B, d.S, d.K}, DType::i32);
  Generator g(5, "bench_v4_attention.idx");
  std::vector<int32_t> pool;
  for (int64_t bt = 0; bt < d.B * d.S; ++bt) {
    const int64_t n = kernels::v4_visible_entries(d, bt % d.S);
    pool.resize(size_t(n));
    std::iota(pool.begin(), pool.end(), 0);
    int32_t* row = idx.data<int32_t>() + bt * d.K;
    for (int64_t j = 0; j < d.K; ++j) {
      if (j >= n) {
        row[j] = -1;
        continue;
      }
      std::swap(pool[size_t(j)], pool[size_t(j + int64_t(g.next_below(uint64_t(n - j))))]);
      row[j] = pool[size_t(j)];
    }
  }
  return idx;
}

void print_pair(const Shape4& s, const kernels::V4AttentionParams& d, const Measure& fused, const Measure& small) {
  char shape[96];
  std::snprintf(shape, sizeof shape, "B%lld S%lld H%lld D%lld W%lld m%lld %s%lld", static_cast<long long>(d.B),
                static_cast<long long>(d.S), static_cast<long long>(d.H), static_cast<long long>(d.D),
                static_cast<long long>(d.W), static_cast<long long>(d.ratio), d.K > 0 ? "K" : "T",
                static_cast<long long>(d.K > 0 ? d.K : d.T));
  std::printf("| %-10s | %-38s | %9.2f | %9.2f | %6.2fx | %9s | %9s | %6.1fx |\n", s.name, shape, 1e3 * fused.seconds,
              1e3 * small.seconds, small.seconds / fused.seconds, train::format_bytes(double(fused.peak_bytes)).c_str(),
              train::format_bytes(double(small.peak_bytes)).c_str(),
              double(small.peak_bytes) / double(std::max<int64_t>(fused.peak_bytes, 1)));
  std::fflush(stdout);
}

std::string only;  // --only: the one shape to run

void run(const Shape4& s, int reps, bool small_ops = true) {
  if (!only.empty() && only != s.name) return;
  kernels::V4AttentionParams d;
  d.B = s.B, d.S = s.S, d.Skv = s.S, d.H = s.H, d.D = s.D, d.W = s.W, d.ratio = s.m, d.K = s.K, d.T = s.S / s.m;
  const double scale = 1.0 / std::sqrt(double(s.D));
  const Tensor q = uniform({d.B, d.S, d.H, d.D}, 1, "q"), kv = uniform({d.B, d.S, d.D}, 2, "kv");
  const Tensor comp = uniform({d.B, d.T, d.D}, 3, "comp"), sink = uniform({d.H}, 4, "sink");
  const Tensor idx = d.K > 0 ? top_k_like(d) : Tensor();
  const Tensor dout = Tensor::full(q.shape(), 1e-3, DType::f32);
  auto step = [&](bool fused) {
    return [&, fused] {
      Variable vq(q, true), vkv(kv, true), vc(comp, true), vs(sink, true);
      Variable o = fused ? autograd::v4_attention(vq, vkv, vc, idx, vs, d.W, d.ratio, scale)
                         : autograd::v4_attention_small_ops(vq, vkv, vc, idx, vs, d.W, d.ratio, scale);
      autograd::backward(o, dout);
    };
  };
  if (small_ops) print_pair(s, d, measure(step(true), reps), measure(step(false), std::max(1, reps / 2)));
  // The fused kernels alone, f32 and bf16 (the inputs rounded), and the rate of their products:
  // per key a query sees, forward 4 H D FLOPs (scores, P V), backward 10 H D (scores and dA, dq,
  // both roles of the key row).
  auto kernel_seconds = [&](DType dt) {
    const Tensor qd = q.to(dt), kvd = kv.to(dt), cd = comp.to(dt), dod = dout.to(dt);
    Tensor o = Tensor::empty(q.shape(), dt), lse = Tensor::empty({d.B, d.S, d.H}, DType::f32);
    Tensor dq = Tensor::empty(q.shape(), dt), dkv = Tensor::empty(kv.shape(), dt), dc = Tensor::empty(comp.shape(), dt);
    Tensor ds = Tensor::empty(sink.shape(), DType::f32);
    // CSA: the indexer's KL target too, as training asks for it
    Tensor hm = d.K > 0 ? Tensor::empty({d.B, d.S, d.K}, DType::f32) : Tensor();
    const double fwd = bench::time_best(
        [&] {
          kernels::v4_attention_forward(o, lse, qd, kvd, cd, idx, sink, d.W, d.ratio, scale, hm.defined() ? &hm : nullptr);
        },
        reps, 1);
    const double bwd = bench::time_best(
        [&] {
          kernels::v4_attention_backward(dq, dkv, dc, ds, dod, qd, kvd, cd, idx, sink, o, lse, d.W, d.ratio, scale);
        },
        reps, 1);
    return std::pair{fwd, bwd};
  };
  const auto [fwd, bwd] = kernel_seconds(DType::f32);
  const auto [fwd16, bwd16] = kernel_seconds(DType::bf16);
  double keys = 0;
  for (int64_t bt = 0; bt < d.B * d.S; ++bt) {
    const int64_t t = bt % d.S;
    int64_t n = t - kernels::v4_window_start(d, t) + 1;
    if (d.K == 0) n += kernels::v4_visible_entries(d, t);
    for (int64_t i = 0; i < d.K; ++i) n += kernels::v4_slot_valid(d, idx.data<int32_t>()[bt * d.K + i], t);
    keys += double(n);
  }
  const double fwd_flops = 4 * double(d.H * d.D) * keys, bwd_flops = 10 * double(d.H * d.D) * keys;
  kernel_rows.push_back({s.name, keys / double(d.B * d.S), 1e3 * fwd, 1e3 * bwd, fwd_flops / fwd / 1e9,
                         bwd_flops / bwd / 1e9, 1e3 * fwd16, 1e3 * bwd16, fwd_flops / fwd16 / 1e9,
                         bwd_flops / bwd16 / 1e9});
}


}  // namespace

int main(int argc, char** argv) {
  int reps = 3;
  bool skip_4k = false, flash = false, long_seq = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--skip-4k") skip_4k = true;
    else if (a == "--flash") flash = true;
    else if (a == "--long") long_seq = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
  }
  std::printf("V4 attention, fused vs small ops (S x (S + T) masked scores), f32, forward + backward, %d threads\n\n",
              num_threads());
  std::printf("| %-10s | %-38s | %9s | %9s | %7s | %9s | %9s | %7s |\n", "layer", "shape", "fused ms", "small ms",
              "small/f", "fused mem", "small mem", "small/f");
  std::printf("|------------|----------------------------------------|-----------|-----------|---------|-----------|"
              "-----------|---------|\n");
  // Debug model: batch 2 x 512 tokens, 8 heads of 64, window 64, CSA m = 4 with top-64, HCA m = 16.
  const std::vector<Shape4> debug = {{"debug CSA", 2, 512, 8, 64, 64, 4, 64}, {"debug HCA", 2, 512, 8, 64, 64, 16, 0}};
  // 4K tokens at V4's window and ratios (W 128, CSA m = 4 with top-512, HCA m = 128), 8 heads of 128.
  const std::vector<Shape4> long_ctx = {{"4K CSA", 1, 4096, 8, 128, 128, 4, 512}, {"4K HCA", 1, 4096, 8, 128, 128, 128, 0}};
  for (const Shape4& s : debug) run(s, reps);
  if (!skip_4k)
    for (const Shape4& s : long_ctx) run(s, reps);
  // V4-Flash's attention heads (64 of 512) at 2K tokens: the fused kernels alone (the small-op
  // form's scores would be [64, 2K, 2.5K] floats per sequence).
  if (flash)
    for (const Shape4& s :
         {Shape4{"flash CSA", 1, 2048, 64, 512, 128, 4, 512}, Shape4{"flash HCA", 1, 2048, 64, 512, 128, 128, 0}})
      run(s, std::max(1, reps / 2), false);
  // debugmodel_long's attention (4 heads of 64, window 128, CSA m = 4 with top-512, HCA m = 128)
  // at 4K and 32K: the kernels alone, their cost per query from 4K to 32K.
  if (long_seq)
    for (const Shape4& s : {Shape4{"4K CSA h4", 1, 4096, 4, 64, 128, 4, 512}, Shape4{"32K CSA h4", 1, 32768, 4, 64, 128, 4, 512},
                            Shape4{"4K HCA h4", 1, 4096, 4, 64, 128, 128, 0}, Shape4{"32K HCA h4", 1, 32768, 4, 64, 128, 128, 0}})
      run(s, std::max(1, reps / 2), false);
  const kernels::MachinePeak peak = kernels::measure_machine_peak();
  std::printf("\nfused kernels alone (GFLOP/s of their products; measured peak: f32 %.0f, bf16 %.0f)\n",
              peak.f32_flops / 1e9, peak.bf16_flops / 1e9);
  std::printf("| %-10s | %7s | %8s | %8s | %7s | %7s | %9s | %9s | %8s | %8s |\n", "layer", "keys/q", "f32 fwd",
              "f32 bwd", "GF/s", "GF/s", "bf16 fwd", "bf16 bwd", "GF/s", "GF/s");
  std::printf("|------------|---------|----------|----------|---------|---------|-----------|-----------|----------|"
              "----------|\n");
  for (const KernelRow& r : kernel_rows)
    std::printf("| %-10s | %7.1f | %5.2f ms | %5.2f ms | %7.1f | %7.1f | %6.2f ms | %6.2f ms | %8.1f | %8.1f |\n",
                r.name, r.keys_per_query, r.fwd_ms, r.bwd_ms, r.fwd_gflops, r.bwd_gflops, r.fwd16_ms, r.bwd16_ms,
                r.fwd16_gflops, r.bwd16_gflops);
  return 0;
}
