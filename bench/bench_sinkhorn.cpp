// mHC's Sinkhorn projection at DeepSeek-V4's shape (N = hc_mult = 4, 20 iterations, two per layer
// per token): the fast kernel against the reference in one run, and what backward's recompute
// costs against keeping the iterations (the choice kernels/sinkhorn.h made).
//   build/bench/bench_sinkhorn [tokens]
#include <cstdio>
#include <cstdlib>

#include "bench_common.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/sinkhorn.h"

using namespace titan;

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 8192, n = 4;
  const int iters = 20;
  const double eps = 1e-6;
  Tensor l = Tensor::empty({tokens, n, n}, DType::f32), dp = Tensor::empty(l.shape(), DType::f32);
  Generator g(3, "bench_sinkhorn");
  for (int64_t i = 0; i < l.numel(); ++i) l.data<float>()[i] = float(2 * g.next_uniform() - 1), dp.data<float>()[i] = float(g.next_uniform());
  Tensor p = Tensor::empty(l.shape(), DType::f32), dl = Tensor::zeros(l.shape(), DType::f32);
  std::printf("sinkhorn: %lld tokens x [%lld x %lld], %d iterations, %d threads\n", static_cast<long long>(tokens),
              static_cast<long long>(n), static_cast<long long>(n), iters, num_threads());
  double fwd[2], bwd[2];
  for (int b = 0; b < 2; ++b) {
    kernels::set_kernel_backend(b == 0 ? kernels::KernelBackend::fast : kernels::KernelBackend::reference);
    fwd[b] = bench::time_best([&] { kernels::sinkhorn_forward(p, l, iters, eps); }, b == 0 ? 20 : 3, 1);
    bwd[b] = bench::time_best([&] { kernels::sinkhorn_backward(dl, dp, l, iters, eps); }, b == 0 ? 20 : 3, 1);
  }
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const double per = 1e9 / double(tokens);
  std::printf("%-10s %14s %14s %10s\n", "", "fast ns/token", "ref ns/token", "speed-up");
  std::printf("%-10s %14.1f %14.1f %9.1fx\n", "forward", fwd[0] * per, fwd[1] * per, fwd[1] / fwd[0]);
  std::printf("%-10s %14.1f %14.1f %9.1fx\n", "backward", bwd[0] * per, bwd[1] * per, bwd[1] / bwd[0]);
  // Backward recomputes the forward (about fwd of its time); keeping the iterations instead
  // would hold (2 iters - 1) x (N^2 + N) floats per token from forward to backward.
  const double kept = double((2 * iters - 1) * (n * n + n)) * 4;
  std::printf("recompute: %.0f%% of backward (%.1f ns/token); keeping the iterations instead: %.0f B/token "
              "(%.0f B of logits saved now), %.1f MiB per layer at %lld tokens\n",
              100 * fwd[0] / bwd[0], fwd[0] * per, kept, double(n * n * 4), kept * double(tokens) / (1 << 20),
              static_cast<long long>(tokens));
  return 0;
}
