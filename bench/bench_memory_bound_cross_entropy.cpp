// Fused cross-entropy throughput as GB/s of logits over measured memcpy bandwidth: forward reads
// the logits once; backward (in place) reads and writes them once.
#include <cstdio>

#include "bench_common.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/cross_entropy.h"

using namespace titan;
using namespace titan::kernels;

int main() {
  // 2 s per peak: the machine is shared, and its best moments are the honest denominator.
  const MachinePeak peak = measure_machine_peak(2.0);
  bench::print_peak(peak);
  std::printf("threads: %d\n", num_threads());
  const int64_t n = 512, v = 129280;  // DeepSeek-V3 vocabulary
  for (DType dtype : {DType::bf16, DType::f32}) {
    Tensor logits = Tensor::empty({n, v}, DType::f32);
    init_uniform(logits, 1, "logits", -8, 8);
    if (dtype != DType::f32) logits = logits.to(dtype);
    Tensor targets = Tensor::empty({n}, DType::i32);
    for (int64_t r = 0; r < n; ++r) targets.data<int32_t>()[r] = int32_t((r * 7919) % v);
    Tensor loss = Tensor::empty({n}, DType::f32), lse = Tensor::empty({n}, DType::f32);
    const double bytes = double(n * v) * (dtype_bits(dtype) / 8);
    const double t_fwd = bench::time_best([&] { cross_entropy_forward(loss, lse, logits, targets); }, 15, 1);
    // In place, as training runs it: dlogits overwrite logits (values change between reps,
    // the work does not).
    const double t_bwd =
        bench::time_best([&] { cross_entropy_mean_backward(logits, logits, targets, lse, 1.0); }, 15, 1);
    std::printf("cross_entropy [%ld, %ld] %-4s fwd %6.1f GB/s of logits (%5.1f%% of memcpy)  "
                "bwd %6.1f GB/s read+write (%5.1f%%)\n",
                long(n), long(v), dtype_name(dtype).data(), bytes / t_fwd / 1e9, 100 * bytes / t_fwd / peak.memcpy_bytes,
                2 * bytes / t_bwd / 1e9, 100 * 2 * bytes / t_bwd / peak.memcpy_bytes);
  }
  return 0;
}
