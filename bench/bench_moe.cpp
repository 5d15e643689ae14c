// MoE layer benchmark at a small realistic config (T = 4096 tokens, D = 1024, F = 512, 16
// experts top-4 plus one shared expert) and at DeepSeek-V3 debugmodel's shape, f32 and bf16:
//   - the MoE layer's forward + backward wall time (module, through autograd);
//   - grouped-GEMM throughput (the 3 expert GEMMs forward and their 6 backward products on this
//     step's routing) against dense GEMMs of the same shapes and FLOPs (target >= 70%);
//   - permute / unpermute (forward and backward) bytes/s against memcpy bandwidth measured between
//     their repetitions (target >= 50%; both count bytes read plus bytes written);
//   - oneDNN primitives created during the timed steps (target 0: the cache covers every piece).
// Usage: bench_moe [tokens [D F experts top-k]] (one config instead of the two)
#include <cstdio>
#include <cstdlib>

#include "bench_common.h"
#include "titan/autograd/variable.h"
#include "titan/core/rng.h"
#include "titan/kernels/grouped_matmul.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/moe_router.h"
#include "titan/kernels/onednn/matmul.h"
#include "titan/models/moe/moe.h"

using namespace titan;

namespace {

Tensor random(const Shape& s, DType dtype, const char* name, double scale = 1.0) {
  Tensor t = Tensor::empty(s, DType::f32);
  init_uniform(t, 1, name, -scale, scale);
  return dtype == DType::f32 ? t : t.to(dtype);
}

struct Config {
  int64_t t, d, f, e, k;
};

void run(const Config& c, DType dtype, const kernels::MachinePeak& peak) {
  const double flop_peak = dtype == DType::f32 ? peak.f32_flops : peak.bf16_flops;
  const int64_t m = c.t * c.k, es = dtype_bits(dtype) / 8;
  std::printf("\n== %s: T=%ld D=%ld F=%ld E=%ld top-%ld (+1 shared) ==\n", std::string(dtype_name(dtype)).c_str(),
              long(c.t), long(c.d), long(c.f), long(c.e), long(c.k));

  // This step's routing: softmax router on random logits (roughly balanced, uneven segments).
  kernels::RouterParams rp;
  rp.experts = c.e, rp.top_k = c.k;
  const Tensor logits = random({c.t, c.e}, DType::f32, "logits", 2.0);
  Tensor scores = Tensor::empty({c.t, c.e}, DType::f32), idx = Tensor::empty({c.t, c.k}, DType::i32),
         weights = Tensor::empty({c.t, c.k}, DType::f32);
  kernels::moe_router_forward(scores, idx, weights, logits, Tensor(), rp);
  const kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, c.e);

  // ---- grouped GEMMs vs dense GEMMs of the same shapes ---------------------------------------
  const Tensor xs = random({m, c.d}, dtype, "xs"), act = random({m, c.f}, dtype, "act");
  const Tensor w1 = random({c.e, c.f, c.d}, dtype, "w1", 0.03), w2 = random({c.e, c.d, c.f}, dtype, "w2", 0.03);
  const Tensor dh = random({m, c.f}, dtype, "dh"), dout = random({m, c.d}, dtype, "dout");
  Tensor h = Tensor::empty({m, c.f}, dtype), o = Tensor::empty({m, c.d}, dtype);
  Tensor dxs = Tensor::zeros({m, c.d}, dtype), dact = Tensor::zeros({m, c.f}, dtype);
  Tensor dw1 = Tensor::zeros({c.e, c.f, c.d}, DType::f32), dw2 = Tensor::zeros({c.e, c.d, c.f}, DType::f32);
  // The layer's GEMM work: w1 and w3 forward (same shape, run twice), w2 forward, and each one's
  // dx and dw products.
  auto grouped = [&] {
    for (int rep = 0; rep < 2; ++rep) kernels::grouped_matmul_forward(h, xs, w1, disp.offsets);
    kernels::grouped_matmul_forward(o, act, w2, disp.offsets);
    kernels::grouped_matmul_backward(dact, dw2, dout, act, w2, disp.offsets);
    for (int rep = 0; rep < 2; ++rep) kernels::grouped_matmul_backward(dxs, dw1, dh, xs, w1, disp.offsets);
  };
  const Tensor dense_w1 = w1.slice(0, 0, 1).view({c.f, c.d}), dense_w2 = w2.slice(0, 0, 1).view({c.d, c.f});
  Tensor ddw1 = Tensor::zeros({c.f, c.d}, DType::f32), ddw2 = Tensor::zeros({c.d, c.f}, DType::f32), no_bias;
  auto dense = [&] {
    for (int rep = 0; rep < 2; ++rep) kernels::linear_forward(h, xs, dense_w1);
    kernels::linear_forward(o, act, dense_w2);
    kernels::linear_backward(dact, ddw2, no_bias, dout, act, dense_w2);
    for (int rep = 0; rep < 2; ++rep) kernels::linear_backward(dxs, ddw1, no_bias, dh, xs, dense_w1);
  };
  const double flops = 2.0 * double(m) * double(c.d) * double(c.f) * 9;
  const double t_dense = bench::time_best(dense, 5, 1), t_grouped = bench::time_best(grouped, 5, 1);
  const double gemm_ratio = t_dense / t_grouped;
  std::printf("grouped GEMM: %.1f GFLOP/s (%.0f%% of peak); dense GEMM same FLOPs: %.1f GFLOP/s; ratio %.0f%% "
              "(target >= 70%%) %s [%s]\n",
              flops / t_grouped / 1e9, 100 * flops / t_grouped / flop_peak, flops / t_dense / 1e9, 100 * gemm_ratio,
              bench::verdict(gemm_ratio, 0.70),
              kernels::grouped_matmul_runs_experts_in_parallel(disp.offsets) ? "one expert per thread"
                                                                             : "experts in order, all threads each");

  // ---- permute / unpermute, forward and backward ------------------------------------------------
  const Tensor x = random({c.t, c.d}, dtype, "x"), dy = random({c.t, c.d}, dtype, "dy");
  Tensor xsp = Tensor::empty({m, c.d}, dtype), y = Tensor::empty({c.t, c.d}, dtype);
  Tensor dx = Tensor::zeros({c.t, c.d}, dtype), d_o = Tensor::empty({m, c.d}, dtype);
  Tensor dweights = Tensor::zeros({c.t, c.k}, DType::f32);
  auto permutes = [&] {
    kernels::moe_permute_forward(xsp, x, disp.pos);
    kernels::moe_unpermute_forward(y, o, disp.pos, weights);
    kernels::moe_unpermute_backward(d_o, dweights, dy, o, disp.pos, weights);
    kernels::moe_permute_backward(dx, dxs, disp.pos);
  };
  // Bytes each pass must move: permute T D in, M D out; unpermute M D in, T D out; unpermute
  // backward T D + M D in, M D out; permute backward M D + T D in, T D out.
  const double td = double(c.t * c.d * es), md = double(m * c.d * es);
  const double bytes = (td + md) + (md + td) + (td + 2 * md) + (md + 2 * td);
  const bench::BesideMemcpy perm = bench::time_best_beside_memcpy(permutes, 10, 2);
  const double perm_ratio = bytes / perm.seconds / perm.memcpy_bytes;
  std::printf("permute+unpermute fwd+bwd: %.2f ms, %.1f GB/s = %.0f%% of memcpy timed alongside (%.1f GB/s) "
              "(target >= 50%%) %s\n",
              1e3 * perm.seconds, bytes / perm.seconds / 1e9, 100 * perm_ratio, perm.memcpy_bytes / 1e9,
              bench::verdict(perm_ratio, 0.50));

  // ---- the whole layer ---------------------------------------------------------------------------
  models::moe::MoEArgs a;
  a.dim = c.d, a.moe_inter_dim = c.f, a.n_routed_experts = c.e, a.n_shared_experts = 1, a.n_activated_experts = c.k;
  models::moe::MoE moe(a, 0.02);
  moe.init_parameters(1);
  if (dtype == DType::bf16) moe.set_compute_dtype(DType::bf16);
  const Tensor xl = random({1, c.t, c.d}, dtype, "x_layer"), dyl = random({1, c.t, c.d}, dtype, "dy_layer");
  autograd::Variable xv(xl, true);
  auto layer = [&] {  // one training step's work: gradients reset, then written by the backward
    moe.zero_grad();
    autograd::TapeScope scope;
    autograd::Variable yv = moe.forward_with_aux(xv).y;
    autograd::backward(yv, dyl);
  };
  layer();
  const int64_t created_before = kernels::onednn::matmul_cache_stats().created;
  const double t_layer = bench::time_best(layer, 3, 1);
  const int64_t created = kernels::onednn::matmul_cache_stats().created - created_before;
  const double layer_flops = flops + 2.0 * double(c.t) * c.d * c.f * 9 + 2.0 * 3 * double(c.t) * c.d * c.e;
  const models::moe::ExpertLoad load = moe.load_stats();
  std::printf("MoE layer fwd+bwd: %.1f ms, %.1f GFLOP/s (%.0f%% of peak); expert load min %.0f max %.0f imbalance %.2f\n",
              1e3 * t_layer, layer_flops / t_layer / 1e9, 100 * layer_flops / t_layer / flop_peak, load.min, load.max,
              load.imbalance);
  std::printf("oneDNN primitives created during timed steps: %ld (target 0) %s\n", long(created),
              created == 0 ? "PASS" : "MISS");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Config> configs = {{4096, 1024, 512, 16, 4},
                                 // DeepSeek-V3 debugmodel's MoE layers at batch 2 x seq 512: segments
                                 // of ~384 rows, where the experts run one per thread
                                 {1024, 256, 256, 8, 3}};
  if (argc > 1) configs = {{std::atol(argv[1]), 1024, 512, 16, 4}};
  if (argc > 5) configs[0].d = std::atol(argv[2]), configs[0].f = std::atol(argv[3]), configs[0].e = std::atol(argv[4]),
    configs[0].k = std::atol(argv[5]);
  const kernels::MachinePeak peak = kernels::measure_machine_peak();
  bench::print_peak(peak);
  for (const Config& c : configs) {
    run(c, DType::f32, peak);
    run(c, DType::bf16, peak);
  }
  return 0;
}
