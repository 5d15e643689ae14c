// Top-k (MoE routing and DSA key selection shapes) and the row gather / scatter-add / embedding
// kernels (MoE permute and combine), as time and as bytes moved over measured memcpy bandwidth.
#include <cstdio>

#include "bench_common.h"
#include "titan/core/parallel.h"
#include "titan/core/rng.h"
#include "titan/kernels/embedding.h"
#include "titan/kernels/gather.h"
#include "titan/kernels/topk.h"

using namespace titan;
using namespace titan::kernels;

namespace {

void bench_topk(const char* name, int64_t rows, int64_t n, int64_t k) {
  Tensor x = Tensor::empty({rows, n}, DType::f32);
  init_uniform(x, 1, "scores", -1, 1);
  x = x.to(DType::bf16);
  Tensor values = Tensor::empty({rows, k}, DType::bf16), indices = Tensor::empty({rows, k}, DType::i32);
  const double t = bench::time_best([&] { topk(values, indices, x, k); }, 5, 1);
  std::printf("topk %-28s [%ld, %ld] k=%-5ld %8.3f ms  %6.2f Gscores/s\n", name, long(rows), long(n), long(k), t * 1e3,
              double(rows * n) / t / 1e9);
}

Tensor indices(int64_t m, int64_t range, const char* name) {
  Tensor idx = Tensor::empty({m}, DType::i32);
  Generator g(7, name);
  for (int64_t i = 0; i < m; ++i) idx.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(range)));
  return idx;
}

void report(const char* name, double bytes, double seconds, double memcpy_bytes) {
  std::printf("%-44s %8.3f ms  %6.1f GB/s  (%5.1f%% of memcpy)\n", name, seconds * 1e3, bytes / seconds / 1e9,
              100 * bytes / seconds / memcpy_bytes);
}

}  // namespace

int main() {
  // 2 s per peak: the machine is shared, and its best moments are the honest denominator.
  const MachinePeak peak = measure_machine_peak(2.0);
  bench::print_peak(peak);
  std::printf("threads: %d\n", num_threads());
  bench_topk("moe routing (256 experts)", 8192, 256, 8);
  bench_topk("dsa selection, 16K keys", 256, 16384, 2048);
  bench_topk("dsa selection, 128K keys", 32, 131072, 2048);

  // MoE permute/combine: N tokens x K experts, D = 2048, bf16 activations.
  const int64_t n = 4096, k = 8, d = 2048;
  const Tensor x = Tensor::full({n, d}, 0.5, DType::bf16);
  const Tensor token_of = indices(n * k, n, "token_of");
  const Tensor w = Tensor::full({n * k}, 0.125, DType::f32);
  Tensor permuted = Tensor::empty({n * k, d}, DType::bf16), combined = Tensor::zeros({n, d}, DType::bf16);
  const double row_bytes = double(d * 2);
  // gather: read a source row, write a destination row; scatter-add: read source and the
  // destination once per destination (it is summed in f32), write it once.
  report("gather_rows_forward (MoE permute)", 2 * double(n * k) * row_bytes,
         bench::time_best([&] { gather_rows_forward(permuted, x, token_of); }, 5, 1), peak.memcpy_bytes);
  report("scatter_add_rows_forward (MoE combine)", (double(n * k) + 2 * double(n)) * row_bytes,
         bench::time_best([&] { scatter_add_rows_forward(combined, permuted, token_of, w); }, 5, 1),
         peak.memcpy_bytes);

  // Embedding with a DeepSeek-V3-sized vocabulary row width and a small table slice touched.
  const int64_t vocab = 129280, dim = 2048, tokens = 8192;
  const Tensor table = Tensor::full({vocab, dim}, 0.01, DType::f32, MemCategory::parameters);
  Tensor dtable = Tensor::zeros({vocab, dim}, DType::f32, MemCategory::gradients);
  const Tensor ids = indices(tokens, vocab, "ids");
  Tensor y = Tensor::empty({tokens, dim}, DType::bf16);
  report("embedding_forward (f32 table -> bf16)", double(tokens * dim) * 6,
         bench::time_best([&] { embedding_forward(y, table, ids); }, 5, 1), peak.memcpy_bytes);
  report("embedding_backward (bf16 dy -> f32 dtable)", double(tokens * dim) * 10,
         bench::time_best([&] { embedding_backward(dtable, y, ids); }, 5, 1), peak.memcpy_bytes);
  return 0;
}
