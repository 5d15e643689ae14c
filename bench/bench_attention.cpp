// Causal flash attention: forward, backward and forward+backward GFLOP/s and fraction of this
// machine's measured peak for the precision, plus the speedup over the reference kernel.
//
// FLOPs counted (causal halves the square): forward = two matmuls, q k^T and P v, over the
// S (S + 1) / 2 visible (i, j) pairs: 2 (Dqk + Dv) flops per pair and head. For Dqk = Dv = D that is
// the customary 4 S^2 D / 2 per head. Backward = 2.5x forward (five matmuls: q k^T recomputed,
// dO v^T, P^T dO, dS^T q, dS k). exp and the softmax bookkeeping are not counted.
#include <algorithm>
#include <cstdio>
#include <string>

#include "bench_common.h"
#include "titan/core/cpu_features.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/attention_unmasked.h"
#include "titan/kernels/cpu/peak.h"
#include "titan/kernels/dispatch.h"

using namespace titan;

namespace {

struct Problem {
  int64_t B, S, H, Hkv, Dqk, Dv;
  DType dtype;
  Tensor q, k, v, o, lse, dout, dq, dk, dv;

  Problem(int64_t b, int64_t s, int64_t h, int64_t hkv, int64_t dqk, int64_t dv_, DType dt)
      : B(b), S(s), H(h), Hkv(hkv), Dqk(dqk), Dv(dv_), dtype(dt) {
    q = random_input({B, S, H, Dqk}, "q");
    k = random_input({B, S, Hkv, Dqk}, "k");
    v = random_input({B, S, Hkv, Dv}, "v");
    dout = random_input({B, S, H, Dv}, "dout");
    o = Tensor::empty({B, S, H, Dv}, dtype);
    lse = Tensor::empty({B, H, S}, DType::f32);
    dq = Tensor::zeros(q.shape(), dtype);
    dk = Tensor::zeros(k.shape(), dtype);
    dv = Tensor::zeros(v.shape(), dtype);
  }
  Tensor random_input(const Shape& shape, std::string_view name) const {
    Tensor t = Tensor::empty(shape, DType::f32);
    init_uniform(t, 42, name, -1, 1);
    return t.to(dtype);
  }
  double forward_flops() const { return double(B * H) * double(S) * double(S + 1) / 2 * 2 * double(Dqk + Dv); }
  void forward() { kernels::attention_forward(o, lse, q, k, v); }
  void backward() { kernels::attention_backward(dq, dk, dv, lse, dout, q, k, v, o); }
  std::string name() const {
    return "B=" + std::to_string(B) + " S=" + std::to_string(S) + " H=" + std::to_string(H) + " Hkv=" +
           std::to_string(Hkv) + " Dqk=" + std::to_string(Dqk) + " Dv=" + std::to_string(Dv) + " " +
           std::string(dtype_name(dtype));
  }
};

// One wall-clock sample of the peak: every thread runs the peak micro-kernel for `iters`.
double peak_sample(double (*kernel)(int64_t), int64_t iters) {
  double work = 0;
  const double t0 = bench::now_seconds();
#pragma omp parallel reduction(+ : work)
  work += kernel(iters);
  return work / (bench::now_seconds() - t0);
}

// Times fwd, bwd and fwd+bwd, interleaved with samples of the peak for the precision that last
// about as long as one fwd+bwd, so kernel and denominator see the same load on a shared machine
// (a short peak sample would more often catch a quiet moment); best of `rounds` each.
void run(Problem& p, int rounds) {
  // bf16's peak is AMX's tile rate where the CPU has it (the bf16 kernels then run on tiles),
  // the vector bf16 dot rate otherwise.
  const bool amx = cpu_capability() == CpuCapability::avx512_bf16 && cpu_amx_bf16_usable();
  double (*peak_kernel)(int64_t) = p.dtype == DType::f32 ? TITAN_CPU_KERNEL(peak_fma_f32)
                                   : amx                    ? TITAN_CPU_KERNEL(peak_amx_bf16)
                                                            : TITAN_CPU_KERNEL(peak_dot_bf16);
  p.forward();
  const double t_first = bench::time_best([&] { p.forward(); p.backward(); }, 1, 0);
  int64_t iters = 1 << 16;
  for (double t0 = bench::now_seconds(); peak_sample(peak_kernel, iters) > 0 && bench::now_seconds() - t0 < 0.5 * t_first;
       t0 = bench::now_seconds()) {
    iters *= 2;
  }
  double t_fwd = 1e300, t_bwd = 1e300, t_both = t_first, peak = 0;
  for (int r = 0; r < rounds; ++r) {
    t_fwd = std::min(t_fwd, bench::time_best([&] { p.forward(); }, 1, 0));
    t_bwd = std::min(t_bwd, bench::time_best([&] { p.backward(); }, 1, 0));
    t_both = std::min(t_both, bench::time_best([&] { p.forward(); p.backward(); }, 1, 0));
    peak = std::max(peak, peak_sample(peak_kernel, iters));
  }
  const double f = p.forward_flops(), b = 2.5 * f;
  std::printf("%s   (peak %s sampled alongside: %.1f GFLOP/s)\n", p.name().c_str(),
              p.dtype == DType::f32 ? "f32 FMA" : amx ? "bf16 AMX" : "bf16 dot", peak / 1e9);
  std::printf("  fwd     %8.2f ms  %7.1f GFLOP/s  %5.1f%% of peak\n", t_fwd * 1e3, f / t_fwd / 1e9, 100 * f / t_fwd / peak);
  std::printf("  bwd     %8.2f ms  %7.1f GFLOP/s  %5.1f%% of peak\n", t_bwd * 1e3, b / t_bwd / 1e9, 100 * b / t_bwd / peak);
  const double frac = (f + b) / t_both / peak;
  std::printf("  fwd+bwd %8.2f ms  %7.1f GFLOP/s  %5.1f%% of peak  [%s vs 50%%]\n", t_both * 1e3,
              (f + b) / t_both / 1e9, 100 * frac, bench::verdict(frac, 0.5));
}

// Ring attention's off-diagonal blocks (kernels/attention_unmasked.h: GEMM tiles) against the
// causal flash kernel, GFLOP/s of fwd+bwd on a block of C queries x C keys and on a causal
// sequence of 2C (about twice the pairs): the ring's cost per pair relative to one rank's.
void ring_block_comparison(int64_t B, int64_t C, int64_t H, int64_t Hkv, int64_t D) {
  Problem causal(B, 2 * C, H, Hkv, D, D, DType::f32);
  Problem block(B, C, H, Hkv, D, D, DType::f32);  // q, k, v of C rows: the block's operands
  const double scale = kernels::default_attention_scale(D);
  const double t_causal = bench::time_best([&] { causal.forward(); causal.backward(); }, 3, 1);
  const double t_block = bench::time_best([&] {
    kernels::attention_unmasked_forward(block.o, block.lse, block.q, block.k, block.v, scale);
    kernels::attention_unmasked_backward(block.dq, block.dk, block.dv, block.lse, block.dout, block.q, block.k,
                                         block.v, block.o, scale);
  }, 3, 1);
  const double f_causal = 3.5 * causal.forward_flops();
  const double f_block = 3.5 * double(B * H) * double(C) * double(C) * 2 * double(2 * D);
  std::printf("ring block %s: unmasked C x C fwd+bwd %.2f ms (%.1f GFLOP/s), causal 2C %.2f ms (%.1f GFLOP/s): "
              "%.2fx the causal kernel's rate\n",
              block.name().c_str(), t_block * 1e3, f_block / t_block / 1e9, t_causal * 1e3, f_causal / t_causal / 1e9,
              (f_block / t_block) / (f_causal / t_causal));
}

}  // namespace

// `bench_attention B S H Hkv Dqk Dv f32|bf16` times that one shape only (when tuning a kernel for
// one model's attention); `bench_attention --bf16` only the bf16 rows of the S = 2048 targets (a
// quick loop while tuning the AMX path).
int main(int argc, char** argv) {
  if (argc == 8) {
    Problem p(std::stoll(argv[1]), std::stoll(argv[2]), std::stoll(argv[3]), std::stoll(argv[4]), std::stoll(argv[5]),
              std::stoll(argv[6]), std::string(argv[7]) == "bf16" ? DType::bf16 : DType::f32);
    run(p, 5);
    return 0;
  }
  bool bf16_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bf16") {
      bf16_only = true;
    } else {
      std::fprintf(stderr, "bench_attention: unknown argument '%s' (use --bf16, or B S H Hkv Dqk Dv f32|bf16)\n",
                   a.c_str());
      return 2;
    }
  }
  const kernels::MachinePeak peak = kernels::measure_machine_peak(0.5);
  bench::print_peak(peak);
  std::printf("threads: %d; CPU kernels: %s variant\n", num_threads(),
              std::string(cpu_capability_name(cpu_capability())).c_str());
  std::printf("FLOPs: fwd = S(S+1)/2 * 2(Dqk+Dv) per head (causal), bwd = 2.5x fwd; peak is f32 FMA for f32, "
              "bf16 AMX (or bf16 dot without AMX) for bf16,\n"
              "re-sampled between kernel runs (the machine is shared; best of each)\n\n");

  struct Shape6 { int64_t B, S, H, Hkv, Dqk, Dv; };
  const Shape6 targets[] = {{1, 2048, 8, 8, 128, 128}, {1, 2048, 8, 2, 128, 128}};
  for (const Shape6& s : targets) {
    for (DType dt : {DType::f32, DType::bf16}) {
      if (bf16_only && dt != DType::bf16) continue;
      Problem p(s.B, s.S, s.H, s.Hkv, s.Dqk, s.Dv, dt);
      run(p, 5);
    }
  }
  if (bf16_only) return 0;
  {
    Problem mla(1, 2048, 8, 8, 192, 128, DType::bf16);  // MLA head dims, for information
    run(mla, 3);
  }
  {
    // deepseek_v3 debugmodel's attention in f32 (bench_train_step's shape), for information:
    // short sequences and Dqk != Dv, where per-block overheads weigh more than at S = 2048.
    Problem mla(2, 512, 16, 16, 192, 128, DType::f32);
    run(mla, 3);
  }

  std::printf("\n");
  ring_block_comparison(1, 1024, 8, 2, 128);  // the S = 2048 target's heads
  ring_block_comparison(1, 1024, 16, 16, 16);  // llama3 debugmodel's (1K chunks: CP 4 at 8K)

  // Reference twin on a smaller shape (it is a scalar per-row loop), same shape fast, as a ratio.
  Problem small(1, 256, 2, 1, 64, 64, DType::f32);
  const double t_fast = bench::time_best([&] { small.forward(); small.backward(); }, 5, 1);
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  const double t_ref = bench::time_best([&] { small.forward(); small.backward(); }, 3, 1);
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  std::printf("\nreference vs fast, %s fwd+bwd: ref %.2f ms, fast %.3f ms, fast is %.0fx faster\n",
              small.name().c_str(), t_ref * 1e3, t_fast * 1e3, t_ref / t_fast);
  return 0;
}
