// Memory-bound kernels of a transformer block (RMSNorm, SwiGLU, softmax; forward and backward)
// on LLM shapes: achieved bandwidth as a fraction of this machine's memcpy bandwidth, and the
// speedup of the fast kernels over their references.
//
// Bytes are the minimum each kernel must move: every input read once, every output written
// once; backward accumulates (+=), so its gradients are read and written. Target: >= 70%.
//
// The machine is shared, so its bandwidth drifts during a run. Each kernel call is therefore
// followed by a 64 MiB memcpy on all threads (the copy measure_machine_peak times), and the
// verdict compares the best of each; each line also shows the kernel's best bandwidth against
// measure_machine_peak's memcpy figure from the start of the run.
//
// Usage: bench_memory_bound [N D [reps]]   (default 8192 4096 10)

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "bench_common.h"
#include "titan/core/cpu_features.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/core/tensor.h"
#include "titan/kernels/activation.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/norm.h"
#include "titan/kernels/softmax.h"

using namespace titan;

namespace {

constexpr double kTarget = 0.70;

Tensor random(const Shape& shape, DType dtype, std::string_view name, double lo = -1, double hi = 1) {
  Tensor t = Tensor::empty(shape, DType::f32);
  init_uniform(t, 7, name, lo, hi);
  return dtype == DType::f32 ? t : t.to(dtype);
}

struct Case {
  std::string name;
  double bytes;               // minimal bytes read + written by one call
  std::function<void()> run;  // one call, through the Tensor-level API
};

// Times the fast kernel reps times, each call followed by a pass of the memcpy probe
// (bench::time_best_beside_memcpy), and the reference (best of 2: it is slow and its ratio only
// needs to be indicative), and prints one line. The fraction is best kernel bandwidth over best
// memcpy bandwidth: both best-of-reps, sampled over the same seconds, so a quiet moment for one is
// a quiet moment for the other.
void report(const Case& c, DType dtype, double peak_memcpy, int reps) {
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const bench::BesideMemcpy best = bench::time_best_beside_memcpy(c.run, reps, 1);
  const double fast = best.seconds, memcpy_best = best.memcpy_bytes;
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  const double ref = bench::time_best(c.run, 2, 0);
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const double rate = c.bytes / fast, fraction = rate / memcpy_best;
  std::printf("%-17s %-4s %7.2f ms %6.2f GB/s = %5.1f%% of memcpy (%5.2f GB/s alongside; %5.1f%% of start peak)  %s"
              "  reference %7.1f ms: fast is %5.1fx\n",
              c.name.c_str(), std::string(dtype_name(dtype)).c_str(), fast * 1e3, rate / 1e9, 100 * fraction,
              memcpy_best / 1e9, 100 * rate / peak_memcpy, bench::verdict(fraction, kTarget), ref * 1e3, ref / fast);
  std::fflush(stdout);
}

void run_dtype(DType dtype, int64_t N, int64_t D, double peak_memcpy, int reps) {
  const double s = dtype_bits(dtype) / 8.0, nd = double(N) * double(D);
  auto run = [&](const Case& c) { report(c, dtype, peak_memcpy, reps); };
  {  // RMSNorm: x [N, D], w [D], rstd [N]
    const Tensor x = random({N, D}, dtype, "x"), w = random({D}, DType::f32, "w", 0.5, 1.5);
    const Tensor dy = random({N, D}, dtype, "dy");
    Tensor y = Tensor::empty({N, D}, dtype), rstd = Tensor::empty({N}, DType::f32);
    Tensor dx = Tensor::zeros({N, D}, dtype), dw = Tensor::zeros({D}, DType::f32);
    run({"rmsnorm_forward", 2 * nd * s + 4.0 * (D + N), [&] { kernels::rmsnorm_forward(y, rstd, x, w, 1e-6); }});
    run({"rmsnorm_backward", 4 * nd * s + 4.0 * (3 * D + N),
         [&] { kernels::rmsnorm_backward(dx, dw, rstd, dy, x, w); }});
  }
  {  // SwiGLU: gate, up, y [N, F] with F = D
    const Tensor gate = random({N, D}, dtype, "gate", -4, 4), up = random({N, D}, dtype, "up");
    const Tensor dy = random({N, D}, dtype, "dy");
    Tensor y = Tensor::empty({N, D}, dtype), dgate = Tensor::zeros({N, D}, dtype), dup = Tensor::zeros({N, D}, dtype);
    run({"swiglu_forward", 3 * nd * s, [&] { kernels::swiglu_forward(y, gate, up); }});
    run({"swiglu_backward", 7 * nd * s, [&] { kernels::swiglu_backward(dgate, dup, dy, gate, up); }});
  }
  {  // softmax over D
    const Tensor x = random({N, D}, dtype, "x", -8, 8), dy = random({N, D}, dtype, "dy");
    Tensor y = Tensor::empty({N, D}, dtype), dx = Tensor::zeros({N, D}, dtype);
    run({"softmax_forward", 2 * nd * s, [&] { kernels::softmax_forward(y, x); }});
    run({"softmax_backward", 4 * nd * s, [&] { kernels::softmax_backward(dx, dy, y); }});
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 2 ? std::atoll(argv[1]) : 8192, D = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 10;
  const kernels::MachinePeak peak = kernels::measure_machine_peak(0.5);
  bench::print_peak(peak);
  std::printf("shape N=%lld x D=%lld, isa %s, %d threads, target %.0f%% of memcpy\n", (long long)N, (long long)D,
              std::string(cpu_capability_name(cpu_capability())).c_str(), num_threads(), 100 * kTarget);
  for (DType dtype : {DType::f32, DType::bf16}) run_dtype(dtype, N, D, peak.memcpy_bytes, reps);
  return 0;
}
