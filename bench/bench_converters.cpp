// `[model] converters`, measured as torchtitan-npu measured its fused kernels against their
// small-op forms: each op's forward + backward, fused vs small-op, at the deepseek_v32
// debugmodel's shapes (configs/deepseek_v32_debug.toml: batch 2, seq 512, f32), time and the
// peak of tensor memory above what was live before; then whole training steps of that model with
// only DSA switched, and with every converter on vs off (small_ops); then DeepSeek-V4's fused ops
// (mHC's hyper-connection maps, the compressors) at its debugmodel's shapes (batch 4 x seq 256).
// Ratios come from this run.
//   build/bench/bench_converters [--batch 2] [--seq 512] [--reps 5] [--v4 (its rows alone)]
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_training.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/hyper_connection.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/autograd/v4_small_op_forms.h"
#include "titan/core/allocator.h"
#include "titan/core/rng.h"
#include "titan/kernels/moe_permute.h"
#include "titan/models/deepseek_v3/model.h"
#include "titan/models/deepseek_v4/args.h"
#include "titan/optim/adamw.h"
#include "titan/optim/clip_grad.h"
#include "titan/train/metrics.h"

using namespace titan;
using autograd::Variable;

namespace {

constexpr int64_t kVocab = 2048;  // the main job's tokenizer

Tensor random_tensor(const Shape& s, uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::empty(s, DType::f32);
  Generator g(seed, "bench_converters");
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(lo + (hi - lo) * g.next_uniform());
  return t;
}

struct Measure {
  double seconds = 0;
  int64_t peak_bytes = 0;  // tensor memory above what was live before
};

// fn runs one forward + backward.
Measure measure(const std::function<void()>& fn, int reps) {
  Measure m;
  m.seconds = bench::time_best(fn, reps, 1);
  const int64_t live = memory_stats().live_total;
  memory_reset_peak();
  fn();
  m.peak_bytes = memory_stats().peak_total - live;
  return m;
}

// Forward + backward of op on fresh leaf copies of the inputs, with a fixed output gradient.
std::function<void()> op_step(std::vector<Tensor> inputs, std::function<Variable(const std::vector<Variable>&)> op) {
  return [inputs = std::move(inputs), op = std::move(op)] {
    std::vector<Variable> vars;
    for (const Tensor& t : inputs) vars.emplace_back(t, true);
    Variable y = op(vars);
    autograd::backward(y, Tensor::full(y.shape(), 1e-3, DType::f32));
  };
}

void print_row(const std::string& name, const std::string& shape, const Measure& fused, const Measure& small) {
  std::printf("| %-26s | %-34s | %9.2f | %9.2f | %5.2fx | %9s | %9s | %5.2fx |\n", name.c_str(), shape.c_str(),
              1e3 * fused.seconds, 1e3 * small.seconds, small.seconds / fused.seconds,
              train::format_bytes(double(fused.peak_bytes)).c_str(), train::format_bytes(double(small.peak_bytes)).c_str(),
              double(small.peak_bytes) / double(std::max<int64_t>(fused.peak_bytes, 1)));
}

void print_header(const char* what, const char* against) {
  std::printf("| %-26s | %-34s | %9s | %9s | %6s | %9s | %9s | %6s |\n", what, against, "fused ms", "small ms", "small/f",
              "fused mem", "small mem", "small/f");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(28, '-').c_str(), std::string(36, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str(), std::string(8, '-').c_str(),
              std::string(11, '-').c_str(), std::string(11, '-').c_str(), std::string(8, '-').c_str());
}

Measure train_steps(const std::vector<std::string>& converters, int64_t batch, int64_t seq, int reps,
                    const std::string& model_name = "deepseek_v32") {
  models::ModelOptions options;
  options.converters = converters;
  auto model = models::build_model(model_name, "debugmodel", kVocab, seq, options);
  model->init_parameters(0);
  model->begin_step(1);
  bench::TrainingStep step(*model, batch, seq, kVocab);
  return measure([&] { step(); }, reps);
}

// DeepSeek-V4's fused ops against their small-op forms (autograd/v4_small_op_forms.h), at the
// debugmodel's shapes: T = 4 x 256 tokens.
void v4_rows(int reps) {
  const auto a = models::deepseek_v4::deepseek_v4_flavor("debugmodel", kVocab);
  const int64_t b = 4, s = 256, t = b * s, n = a.hc_mult, d = a.dim, m = (n + 2) * n, hd = a.head_dim;
  const double eps = a.hc_eps;
  const int iters = int(a.hc_sinkhorn_iters);
  std::printf("\ndeepseek_v4 debugmodel shapes, batch %lld x seq %lld = %lld tokens, f32, forward + backward per op\n\n",
              static_cast<long long>(b), static_cast<long long>(s), static_cast<long long>(t));
  print_header("op", "shape");
  // One hyper-connection's maps around a block: the mixes into pre / post / Sinkhorn, the
  // collapse of the streams, and the expand of the block's output back into them.
  {
    const std::vector<Tensor> in = {random_tensor({t, m}, 11, -2, 2), random_tensor({m}, 12), random_tensor({3}, 13, 0.5, 1.5),
                                    random_tensor({t, n, d}, 14), random_tensor({t, d}, 15)};
    auto hc = [&](bool fused) {
      return op_step(in, [&, fused](auto& v) {
        const Variable w = fused ? autograd::hc_weights(v[0], v[1], v[2], n, eps)
                                 : autograd::hc_weights_small_ops(v[0], v[1], v[2], n, eps);
        const Variable pre = autograd::narrow_last(w, 0, n), post = autograd::narrow_last(w, n, n);
        const Variable logits = autograd::view(autograd::narrow_last(w, 2 * n, n * n), {t, n, n});
        const Variable comb = fused ? autograd::sinkhorn(logits, iters, eps) : autograd::sinkhorn_small_ops(logits, iters, eps);
        const Variable u = fused ? autograd::hc_collapse(v[3], pre) : autograd::hc_collapse_small_ops(v[3], pre);
        const Variable a_out = autograd::add(u, v[4]);
        return fused ? autograd::hc_expand(v[3], a_out, post, comb) : autograd::hc_expand_small_ops(v[3], a_out, post, comb);
      });
    };
    print_row("hyper_connection (mHC)", "streams [" + std::to_string(t) + ", " + std::to_string(n) + ", " + std::to_string(d) + "]",
              measure(hc(true), reps), measure(hc(false), reps));
  }
  // The compressors: CSA (ratio 4, overlapping windows, 2 x head_dim channels) and HCA (ratio 16).
  for (const bool csa : {true, false}) {
    const int64_t ratio = csa ? a.csa_ratio : a.hca_ratio, c = csa ? 2 * hd : hd;
    const kernels::CompressorKind kind = csa ? kernels::CompressorKind::csa : kernels::CompressorKind::hca;
    const std::vector<Tensor> in = {random_tensor({b, s, c}, 16), random_tensor({b, s, c}, 17, -3, 3), random_tensor({ratio, c}, 18)};
    print_row(std::string("compressor (") + (csa ? "CSA" : "HCA") + ", m = " + std::to_string(ratio) + ")",
              "kv, gate [" + std::to_string(t) + ", " + std::to_string(c) + "]",
              measure(op_step(in, [&](auto& v) { return autograd::compressor(v[0], v[1], v[2], ratio, kind); }), reps),
              measure(op_step(in, [&](auto& v) { return autograd::compressor_small_ops(v[0], v[1], v[2], ratio, kind); }), reps));
  }
  std::printf("\n(the V4 attention pair: build/bench/bench_v4_attention)\n");

  std::printf("\none training step of the deepseek_v4 debugmodel (forward, backward, AdamW), %lld x %lld tokens, f32\n\n",
              static_cast<long long>(b), static_cast<long long>(s));
  print_header("converters", "vs");
  const int step_reps = std::max(1, reps / 2);
  const Measure fused =
      train_steps({"grouped_mm_fused", "permute_fused", "hyper_connection_fused", "compressor_fused"}, b, s, step_reps,
                  "deepseek_v4");
  const Measure small = train_steps({"small_ops"}, b, s, step_reps, "deepseek_v4");
  print_row("all fused", "small_ops", fused, small);
  std::printf("\nall converters on: %.2fx the tokens/s of small_ops, %.2fx its peak tensor memory\n",
              small.seconds / fused.seconds, double(fused.peak_bytes) / double(small.peak_bytes));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 2, seq = 512;
  int reps = 5;
  bool v4_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--v4") v4_only = true;
    else if (i + 1 >= argc) break;
    else if (a == "--batch") batch = std::atoll(argv[++i]);
    else if (a == "--seq") seq = std::atoll(argv[++i]);
    else if (a == "--reps") reps = std::atoi(argv[++i]);
  }
  if (v4_only) {
    v4_rows(reps);
    return 0;
  }
  const auto a = models::deepseek_v3::deepseek_v32_flavor("debugmodel", kVocab);
  const int64_t t = batch * seq, d = a.dim, e = a.n_routed_experts, k = a.n_activated_experts, f = a.moe_inter_dim;
  std::printf("deepseek_v32 debugmodel shapes, batch %lld x seq %lld = %lld tokens, f32, forward + backward per op\n\n",
              static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(t));
  print_header("op", "shape");

  // RMSNorm over the residual stream: x [T, D].
  {
    const std::vector<Tensor> in = {random_tensor({t, d}, 1), random_tensor({d}, 2, 0.5, 1.5)};
    print_row("rms_norm", "x [" + std::to_string(t) + ", " + std::to_string(d) + "]",
              measure(op_step(in, [&](auto& v) { return autograd::rmsnorm(v[0], v[1], a.norm_eps); }), reps),
              measure(op_step(in, [&](auto& v) { return autograd::rmsnorm_small_ops(v[0], v[1], a.norm_eps); }), reps));
  }
  // RoPE on MLA's query: q [B, S, H, d_n + d_r], the last d_r dims rotated (interleaved).
  {
    const kernels::RopeTables tables = kernels::rope_tables(a.rope(), seq);
    Tensor pos = Tensor::empty({batch, seq}, DType::i32);
    for (int64_t i = 0; i < t; ++i) pos.data<int32_t>()[i] = int32_t(i % seq);
    const int64_t dh = a.qk_nope_head_dim + a.qk_rope_head_dim;
    const std::vector<Tensor> in = {random_tensor({batch, seq, a.n_heads, dh}, 3)};
    auto run = [&, pos](bool fused) {
      return op_step(in, [&, pos, fused](auto& v) {
        return fused ? autograd::rope(v[0], tables, pos, kernels::RopeLayout::interleaved, a.qk_nope_head_dim)
                     : autograd::rope_small_ops(v[0], tables, pos, kernels::RopeLayout::interleaved, a.qk_nope_head_dim);
      });
    };
    print_row("rope (MLA query)", "q [" + std::to_string(t) + ", " + std::to_string(a.n_heads) + ", " + std::to_string(dh) + "]",
              measure(run(true), reps), measure(run(false), reps));
  }
  // The routing of T tokens to top-k of E experts (uniform), shared by the MoE ops below.
  Tensor idx = Tensor::empty({t, k}, DType::i32);
  Generator g(7);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < k; ++j) {
      int32_t c;
      bool again = true;
      while (again) {
        c = int32_t(g.next_below(uint64_t(e)));
        again = false;
        for (int64_t p = 0; p < j; ++p) again = again || idx.data<int32_t>()[i * k + p] == c;
      }
      idx.data<int32_t>()[i * k + j] = c;
    }
  const kernels::ExpertDispatch disp = kernels::moe_sort_by_expert(idx, e);
  const int64_t m = t * k;
  // Grouped GEMM: the experts' up projection, [M, D] x [E, F, D].
  {
    const std::vector<Tensor> in = {random_tensor({m, d}, 4), random_tensor({e, f, d}, 5, -0.05, 0.05)};
    print_row("grouped_mm (w1)", "[" + std::to_string(m) + ", " + std::to_string(d) + "] x [" + std::to_string(e) + ", " +
                                      std::to_string(f) + ", " + std::to_string(d) + "]",
              measure(op_step(in, [&](auto& v) { return autograd::grouped_matmul(v[0], v[1], disp.offsets); }), reps),
              measure(op_step(in, [&](auto& v) { return autograd::grouped_matmul_small_ops(v[0], v[1], disp.offsets); }), reps));
  }
  // Permute then unpermute (the MoE layer's token shuffle around its experts): x [T, D].
  {
    const std::vector<Tensor> in = {random_tensor({t, d}, 6), random_tensor({t, k}, 7, 0, 1)};
    print_row("permute + unpermute", "x [" + std::to_string(t) + ", " + std::to_string(d) + "], top-" + std::to_string(k),
              measure(op_step(in, [&](auto& v) { return autograd::moe_unpermute(autograd::moe_permute(v[0], disp.pos), disp.pos, v[1]); }), reps),
              measure(op_step(in, [&](auto& v) {
                        return autograd::moe_unpermute_small_ops(autograd::moe_permute_small_ops(v[0], disp.pos), disp.pos, v[1]);
                      }), reps));
  }

  std::printf("\none training step of the deepseek_v32 debugmodel (forward, backward, AdamW), %lld x %lld tokens, f32\n\n",
              static_cast<long long>(batch), static_cast<long long>(seq));
  print_header("converters", "vs");
  const int step_reps = std::max(1, reps / 2);
  const Measure dsa_fused = train_steps({"dsa_fused"}, batch, seq, step_reps);
  const Measure dsa_small = train_steps({"dsa_small_ops"}, batch, seq, step_reps);
  print_row("dsa_fused (others default)", "dsa_small_ops", dsa_fused, dsa_small);
  const Measure all_fused =
      train_steps({"rms_norm_fused", "rope_fused", "grouped_mm_fused", "permute_fused", "dsa_fused"}, batch, seq, step_reps);
  const Measure all_small = train_steps({"small_ops"}, batch, seq, step_reps);
  print_row("all fused", "small_ops", all_fused, all_small);
  std::printf("\nall converters on: %.2fx the tokens/s of small_ops, %.2fx its peak tensor memory\n",
              all_small.seconds / all_fused.seconds, double(all_fused.peak_bytes) / double(all_small.peak_bytes));
  v4_rows(reps);
  return 0;
}
