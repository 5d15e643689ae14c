// DeepSeek-V4 attention (kernels/v4_attention.h): transformers' formula written densely in double
// (keys = [kv | comp], an additive [S, S + T] mask from the window and the visible or selected
// entries, the sink as one more logit column, softmax, the sink dropped) is the oracle for the
// reference twin and for the fast kernels at every ISA level this CPU has, forward and backward
// (the backward oracle: the reference, checked against central differences in
// tests/gradcheck/v4_attention_test.cpp), on awkward shapes. Then the autograd op against the
// kernels, the small-op form against the fused op (values and every gradient), entries nobody
// selects, same bits on every run, and the errors bad sizes get. On CSA calls the forward's head_mean (the indexer's KL target)
// is checked against the same dense formula.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/gradcheck.h"
#include "common/kernel_check.h"
#include "common/v4_attention_inputs.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/small_op_forms.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/v4_attention.h"

using namespace titan;
using namespace titan::test;
using kernels::V4AttentionParams;

namespace {

// {B, S, H, D, W, m, K}: S not a multiple of m, W > S, K > visible entries (with future, -1 and
// out-of-range slots), S < m (no entry), one head, odd head counts and widths.
const std::vector<std::vector<int64_t>> kShapes = {
    {1, 1, 1, 1, 1, 2, 0},    {1, 11, 1, 5, 16, 4, 0},  {2, 13, 3, 7, 4, 4, 9},  {1, 17, 5, 33, 6, 3, 2},
    {1, 6, 2, 3, 2, 8, 0},    {1, 6, 2, 3, 2, 8, 3},    {2, 21, 4, 16, 21, 2, 0}, {1, 30, 7, 17, 5, 4, 40},
    {1, 40, 20, 24, 9, 5, 3},  {1, 70, 3, 1000, 40, 5, 12},  // several key chunks in the fast kernel
    {1, 33, 5, 64, 9, 4, 6},   {1, 90, 3, 512, 70, 4, 0},    // bf16 pairs (D % 32 == 0), the second in chunks
    // f32 runs 16 / H queries per block: H = 4 as the debug models (4 per block, a partial last
    // block, and one whose union of selected entries spans several key chunks at D = 600)
    {2, 38, 4, 64, 16, 4, 10}, {1, 70, 4, 32, 12, 8, 0},    {1, 43, 4, 600, 9, 2, 18},
    // CSA entries read in place on AVX-512 (f32, H dividing 16, D a multiple of 16 / H): 2, 8 and
    // 1 heads (the 4-head cases above), D past one 64-float chunk in the first
    {1, 29, 2, 80, 7, 3, 11},  {1, 37, 8, 6, 5, 2, 9},      {1, 25, 1, 48, 6, 2, 13},
};

// transformers' eager attention in double from the same inputs: o [B, S, H, D] and lse; for CSA
// also the indexer's target hm [B, S, K]: per slot, the head mean of each head's softmax over the
// selected visible entries alone (0 for other slots).
void dense_oracle(Doubles& o, Doubles& lse, Doubles& hm, const V4AttentionCase& c) {
  const V4AttentionParams& d = c.d;
  const Doubles q = to_doubles(c.q), kv = to_doubles(c.kv), comp = to_doubles(c.comp), sink = to_doubles(c.sink);
  const int64_t L = d.S + d.T;
  o.assign(size_t(d.B * d.S * d.H * d.D), 0.0);
  lse.assign(size_t(d.B * d.S * d.H), 0.0);
  hm.assign(size_t(d.B * d.S * d.K), 0.0);
  std::vector<double> bias(static_cast<size_t>(L)), z(static_cast<size_t>(L + 1));
  for (int64_t b = 0; b < d.B; ++b) {
    auto key = [&](int64_t j) {
      return j < d.S ? &kv[size_t((b * d.S + j) * d.D)] : &comp[size_t((b * d.T + j - d.S) * d.D)];
    };
    for (int64_t t = 0; t < d.S; ++t) {
      std::fill(bias.begin(), bias.end(), -std::numeric_limits<double>::infinity());
      for (int64_t j = 0; j < d.S; ++j)
        if (t - d.W < j && j <= t) bias[size_t(j)] = 0;
      for (int64_t w = 0; w < d.T; ++w) {
        bool on = false;
        if (!c.idx.defined()) {
          on = w < (t + 1) / d.ratio;
        } else {
          for (int64_t i = 0; i < d.K; ++i) on = on || c.idx.data<int32_t>()[(b * d.S + t) * d.K + i] == w;
          on = on && w < (t + 1) / d.ratio;
        }
        if (on) bias[size_t(d.S + w)] = 0;
      }
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        double m = sink[size_t(h)];
        for (int64_t j = 0; j < L; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d.D; ++e) dot += q[size_t(row * d.D + e)] * key(j)[e];
          z[size_t(j)] = d.scale * dot + bias[size_t(j)];
          m = std::max(m, z[size_t(j)]);
        }
        z[size_t(L)] = sink[size_t(h)];
        double sum = 0;
        for (int64_t j = 0; j <= L; ++j) sum += std::exp(z[size_t(j)] - m);
        lse[size_t(row)] = m + std::log(sum);
        for (int64_t j = 0; j < L; ++j) {
          const double p = std::exp(z[size_t(j)] - lse[size_t(row)]);
          for (int64_t e = 0; e < d.D; ++e) o[size_t(row * d.D + e)] += p * key(j)[e];
        }
        if (!c.idx.defined()) continue;
        double entries = 0;  // the head's mass on the visible entries (all selected ones)
        for (int64_t w = 0; w < d.T; ++w) entries += std::exp(z[size_t(d.S + w)] - lse[size_t(row)]);
        for (int64_t i = 0; i < d.K; ++i) {
          const int32_t w = c.idx.data<int32_t>()[(b * d.S + t) * d.K + i];
          if (w < 0 || w >= d.T || bias[size_t(d.S + w)] != 0) continue;
          hm[size_t((b * d.S + t) * d.K + i)] += std::exp(z[size_t(d.S + w)] - lse[size_t(row)]) / entries / double(d.H);
        }
      }
    }
  }
}

struct Outputs {
  Tensor o, lse, dq, dkv, dcomp, dsink, hm;  // hm: CSA only
};

Outputs run_kernels(const V4AttentionCase& c, const Tensor& dout) {
  const V4AttentionParams& d = c.d;
  Outputs r{Tensor::empty(c.q.shape(), c.q.dtype()), Tensor::empty({d.B, d.S, d.H}, DType::f32),
            Tensor::empty(c.q.shape(), c.q.dtype()), Tensor::empty(c.kv.shape(), c.q.dtype()),
            Tensor::empty(c.comp.shape(), c.q.dtype()), Tensor::empty({d.H}, DType::f32), Tensor()};
  if (c.idx.defined()) r.hm = Tensor::empty({d.B, d.S, d.K}, DType::f32);
  kernels::v4_attention_forward(r.o, r.lse, c.q, c.kv, c.comp, c.idx, c.sink, d.W, d.ratio, d.scale,
                                c.idx.defined() ? &r.hm : nullptr);
  kernels::v4_attention_backward(r.dq, r.dkv, r.dcomp, r.dsink, dout, c.q, c.kv, c.comp, c.idx, c.sink, r.o, r.lse, d.W,
                                 d.ratio, d.scale);
  return r;
}

void expect_close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, double atol,
                  double rtol) {
  const ErrorStats e = compare(got, want, atol, rtol);
  EXPECT_TRUE(e.nonfinite == 0 && e.max_scaled <= 1.0) << what << ": " << error_report(e, got, want);
}

std::string label(const std::vector<int64_t>& s, DType dt) {
  std::string r = "{B, S, H, D, W, m, K} = {";
  for (int64_t v : s) r += std::to_string(v) + " ";
  return r + "} " + std::string(dtype_name(dt));
}

}  // namespace

// The forward of both backends at every ISA level against the dense formula; the fast backward
// against the reference backward at every ISA level (f32 and bf16 inputs).
TEST(V4Attention, MatchesTheDenseFormulaAtEveryIsaLevel) {
  uint64_t seed = 1;
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const auto& s : kShapes) {
      const V4AttentionCase c(s, dt, seed++);
      const Tensor dout = random_tensor(c.q.shape(), dt, seed, "dout");
      Doubles o, lse, hm;
      dense_oracle(o, lse, hm, c);
      kernels::set_kernel_backend(kernels::KernelBackend::reference);
      const Outputs ref = run_kernels(c, dout);
      kernels::set_kernel_backend(kernels::KernelBackend::fast);
      const bool low = dt == DType::bf16;
      const double atol = low ? 2e-2 : 1e-5, rtol = low ? 2e-2 : 1e-4;
      expect_close(label(s, dt) + " reference o", to_doubles(ref.o), o, atol, rtol);
      expect_close(label(s, dt) + " reference lse", to_doubles(ref.lse), lse, 1e-5, 1e-5);
      if (ref.hm.defined()) expect_close(label(s, dt) + " reference head_mean", to_doubles(ref.hm), hm, 1e-5, 1e-4);
      for_each_isa([&](CpuCapability isa) {
        const Outputs fast = run_kernels(c, dout);
        const std::string at = label(s, dt) + " isa=" + isa_label(isa);
        expect_close(at + " o", to_doubles(fast.o), o, atol, rtol);
        expect_close(at + " lse", to_doubles(fast.lse), lse, 1e-5, 1e-5);
        if (fast.hm.defined()) expect_close(at + " head_mean", to_doubles(fast.hm), hm, 1e-5, 1e-4);
        expect_close(at + " dq", to_doubles(fast.dq), to_doubles(ref.dq), atol, rtol);
        expect_close(at + " dkv", to_doubles(fast.dkv), to_doubles(ref.dkv), atol, rtol);
        expect_close(at + " dcomp", to_doubles(fast.dcomp), to_doubles(ref.dcomp), atol, rtol);
        expect_close(at + " dsink", to_doubles(fast.dsink), to_doubles(ref.dsink), atol, rtol);
      });
    }
  }
}

// The key rows' gradients and dsink sum per-thread partials in a fixed order: the same call gives
// the same bits every run, however its threads happen to be scheduled.
TEST(V4Attention, GradientsSameBitsEveryRun) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);  // more threads than this machine's cores: the schedule varies run to run
  for (const DType dt : {DType::f32, DType::bf16}) {
    const V4AttentionCase c({2, 45, 3, 64, 7, 4, 5}, dt, 21);  // D = 64: bf16 runs on bf16 pairs
    const Tensor dout = random_tensor(c.q.shape(), dt, 22, "dout");
    const Outputs first = run_kernels(c, dout);
    for (int run = 1; run < 6; ++run) {
      const Outputs again = run_kernels(c, dout);
      for (const auto& [a, b] : {std::pair{first.dq, again.dq}, std::pair{first.dkv, again.dkv},
                                 std::pair{first.dcomp, again.dcomp}, std::pair{first.dsink, again.dsink}})
        EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << dtype_name(dt) << " run " << run;
    }
  }
  omp_set_num_threads(saved);
}

// An entry no query selects gets exactly 0 gradient (nothing is ever added to its row), one that
// is selected does not: CSA rows of one slot each, with every slot naming entry 2 dropped.
TEST(V4Attention, UnselectedEntriesGetZeroGradient) {
  const V4AttentionCase c({1, 15, 2, 8, 3, 4, 1}, DType::f32, 5, false);
  // Rows 3..6 see only entry 0, so they select it; entry 2 (visible from t = 11) is dropped by hand.
  Tensor idx = c.idx.clone();
  for (int64_t i = 0; i < idx.numel(); ++i)
    if (idx.data<int32_t>()[i] == 2) idx.data<int32_t>()[i] = -1;
  V4AttentionCase dropped = c;
  dropped.idx = idx;
  for (const auto backend : {kernels::KernelBackend::reference, kernels::KernelBackend::fast}) {
    kernels::set_kernel_backend(backend);
    const Outputs r = run_kernels(dropped, random_tensor(c.q.shape(), DType::f32, 6, "dout"));
    double selected = 0;
    for (int64_t e = 0; e < c.d.D; ++e) {
      EXPECT_EQ(r.dcomp.data<float>()[2 * c.d.D + e], 0.0f) << e;
      selected += std::fabs(r.dcomp.data<float>()[e]);
    }
    EXPECT_GT(selected, 0.0);
  }
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
}

// A CSA row listing an entry in two slots counts it twice (the reference's per-slot sum); the
// fast f32 kernel, which merges the slots of a block's queries into one key list, matches it.
TEST(V4Attention, RepeatedSlotsCountOncePerSlot) {
  V4AttentionCase c({1, 29, 4, 16, 5, 2, 6}, DType::f32, 31, false);
  c.idx = c.idx.clone();
  int32_t* idx = c.idx.data<int32_t>();
  for (int64_t t = 0; t < c.d.S; t += 2) idx[t * c.d.K + 1] = idx[t * c.d.K + 3] = idx[t * c.d.K];
  const Tensor dout = random_tensor(c.q.shape(), DType::f32, 32, "dout");
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  const Outputs ref = run_kernels(c, dout);
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const Outputs fast = run_kernels(c, dout);
  expect_close("o", to_doubles(fast.o), to_doubles(ref.o), 1e-5, 1e-4);
  expect_close("lse", to_doubles(fast.lse), to_doubles(ref.lse), 1e-5, 1e-5);
  expect_close("head_mean", to_doubles(fast.hm), to_doubles(ref.hm), 1e-5, 1e-4);
  expect_close("dq", to_doubles(fast.dq), to_doubles(ref.dq), 1e-5, 1e-4);
  expect_close("dkv", to_doubles(fast.dkv), to_doubles(ref.dkv), 1e-5, 1e-4);
  expect_close("dcomp", to_doubles(fast.dcomp), to_doubles(ref.dcomp), 1e-5, 1e-4);
  expect_close("dsink", to_doubles(fast.dsink), to_doubles(ref.dsink), 1e-5, 1e-4);
}

// The autograd op hands each input exactly the kernel's gradient (adopted or added to one already
// there), and head_mean_out the kernel's indexer target.
TEST(V4Attention, AutogradOpGradientsAreTheKernels) {
  for (const DType dt : {DType::f32, DType::bf16}) {
    const V4AttentionCase c({2, 19, 3, 32, 6, 4, 3}, dt, 7);
    const Tensor dout = random_tensor(c.q.shape(), dt, 8, "dout");
    const Outputs want = run_kernels(c, dout);
    autograd::Variable q(c.q.clone(), true), kv(c.kv.clone(), true), comp(c.comp.clone(), true);
    autograd::Variable sink(c.sink.clone(), true);
    kv.ensure_grad();  // kv's gradient already exists (zero): the op adds to it
    Tensor head_mean;
    autograd::Variable o = autograd::v4_attention(q, kv, comp, c.idx, sink, c.d.W, c.d.ratio, c.d.scale, &head_mean);
    autograd::backward(o, dout);
    EXPECT_EQ(to_doubles(head_mean), to_doubles(want.hm)) << dtype_name(dt);
    EXPECT_EQ(to_doubles(o.value()), to_doubles(want.o)) << dtype_name(dt);
    for (const auto& [got, w] : {std::pair{q.grad(), want.dq}, std::pair{kv.grad(), want.dkv},
                                 std::pair{comp.grad(), want.dcomp}, std::pair{sink.grad(), want.dsink}})
      EXPECT_EQ(to_doubles(got), to_doubles(w)) << dtype_name(dt);
  }
}

// The small-op form (the S x (S + T) masked scores) computes the fused op's values and gradients,
// for HCA, CSA with future and -1 slots, and a sliding-only layer.
TEST(V4Attention, SmallOpFormMatchesFused) {
  for (const auto& s : std::vector<std::vector<int64_t>>{{2, 19, 3, 16, 6, 4, 0}, {1, 23, 4, 12, 5, 4, 7},
                                                         {1, 7, 2, 8, 3, 8, 0}}) {
    const V4AttentionCase c(s, DType::f32, 9);
    const Tensor dout = random_tensor(c.q.shape(), DType::f32, 10, "dout");
    std::vector<Tensor> values, grads;
    for (const bool fused : {true, false}) {
      autograd::Variable q(c.q.clone(), true), kv(c.kv.clone(), true), comp(c.comp.clone(), true);
      autograd::Variable sink(c.sink.clone(), true);
      autograd::Variable o =
          fused ? autograd::v4_attention(q, kv, comp, c.idx, sink, c.d.W, c.d.ratio, c.d.scale)
                : autograd::v4_attention_small_ops(q, kv, comp, c.idx, sink, c.d.W, c.d.ratio, c.d.scale);
      autograd::backward(o, dout);
      values.push_back(o.value());
      for (const autograd::Variable* v : {&q, &kv, &comp, &sink})
        grads.push_back(v->grad().defined() ? v->grad() : Tensor::zeros(v->shape(), DType::f32));
    }
    expect_close(label(s, DType::f32) + " o", to_doubles(values[0]), to_doubles(values[1]), 1e-5, 1e-4);
    const char* names[] = {"dq", "dkv", "dcomp", "dsink"};
    for (size_t i = 0; i < 4; ++i)
      expect_close(label(s, DType::f32) + " " + names[i], to_doubles(grads[i]), to_doubles(grads[4 + i]), 1e-5, 1e-4);
  }
}

// Context parallelism's contract: a chunk of a sequence's queries (first at position P0), given
// only the window's W - 1 raw key rows before it and the entries up to its end, gives the whole
// call's rows of o, lse and dq, and its key gradients, added up over the chunks, the whole call's.
// CSA (with future, -1 and out-of-range slots), HCA and sliding-only; 4 chunks of 12, the window
// crossing every boundary; both backends, f32 and bf16 (D = 32: bf16 pairs).
TEST(V4Attention, ChunksGiveTheWholeSequencesRows) {
  for (const DType dt : {DType::f32, DType::bf16})
    for (const auto& s : std::vector<std::vector<int64_t>>{{2, 48, 3, 32, 7, 4, 5}, {2, 48, 3, 32, 7, 4, 0},
                                                           {1, 48, 2, 32, 13, 64, 0}}) {
      const V4AttentionCase whole(s, dt, 31);
      const V4AttentionParams& d = whole.d;
      const Tensor dout = random_tensor(whole.q.shape(), dt, 32, "dout");
      for (const auto backend : {kernels::KernelBackend::reference, kernels::KernelBackend::fast}) {
        kernels::set_kernel_backend(backend);
        const Outputs want = run_kernels(whole, dout);
        Tensor dkv = Tensor::zeros(whole.kv.shape(), DType::f32), dcomp = Tensor::zeros(whole.comp.shape(), DType::f32);
        std::vector<double> dsink(size_t(d.H), 0.0);
        const int64_t len = 12;
        for (int64_t p0 = 0; p0 < d.S; p0 += len) {
          const int64_t before = std::min(d.W - 1, p0), entries = (p0 + len) / d.ratio;
          V4AttentionCase c = whole;
          c.d.S = len, c.d.Skv = before + len, c.d.P0 = p0, c.d.T = entries;
          c.q = whole.q.slice(1, p0, p0 + len).contiguous();
          c.kv = whole.kv.slice(1, p0 - before, p0 + len).contiguous();
          c.comp = whole.comp.slice(1, 0, entries).contiguous();
          if (whole.idx.defined()) c.idx = whole.idx.slice(1, p0, p0 + len).contiguous();
          Outputs r{Tensor::empty(c.q.shape(), dt), Tensor::empty({d.B, len, d.H}, DType::f32),
                    Tensor::empty(c.q.shape(), dt), Tensor::empty(c.kv.shape(), dt), Tensor::empty(c.comp.shape(), dt),
                    Tensor::empty({d.H}, DType::f32), Tensor()};
          const Tensor dout_c = dout.slice(1, p0, p0 + len).contiguous();
          kernels::v4_attention_forward(r.o, r.lse, c.q, c.kv, c.comp, c.idx, c.sink, d.W, d.ratio, d.scale, nullptr, p0);
          kernels::v4_attention_backward(r.dq, r.dkv, r.dcomp, r.dsink, dout_c, c.q, c.kv, c.comp, c.idx, c.sink, r.o,
                                         r.lse, d.W, d.ratio, d.scale, p0);
          const std::string at = label(s, dt) + " chunk at " + std::to_string(p0);
          const double tol = dt == DType::bf16 ? 1e-2 : 1e-6;
          expect_close(at + " o", to_doubles(r.o), to_doubles(want.o.slice(1, p0, p0 + len).contiguous()), tol, tol);
          expect_close(at + " lse", to_doubles(r.lse), to_doubles(want.lse.slice(1, p0, p0 + len).contiguous()), 1e-6, 1e-6);
          expect_close(at + " dq", to_doubles(r.dq), to_doubles(want.dq.slice(1, p0, p0 + len).contiguous()), tol, tol);
          const Doubles chunk_dkv = to_doubles(r.dkv), chunk_dcomp = to_doubles(r.dcomp);
          for (int64_t b = 0; b < d.B; ++b) {
            for (int64_t i = 0; i < (before + len) * d.D; ++i)
              dkv.data<float>()[(b * d.S + p0 - before) * d.D + i] += float(chunk_dkv[size_t(b * (before + len) * d.D + i)]);
            for (int64_t i = 0; i < entries * d.D; ++i)
              dcomp.data<float>()[b * d.T * d.D + i] += float(chunk_dcomp[size_t(b * entries * d.D + i)]);
          }
          for (int64_t h = 0; h < d.H; ++h) dsink[size_t(h)] += r.dsink.data<float>()[h];
        }
        const std::string at = label(s, dt) + (backend == kernels::KernelBackend::fast ? " fast" : " reference");
        const double tol = dt == DType::bf16 ? 3e-2 : 1e-5;
        expect_close(at + " dkv summed", to_doubles(dkv), to_doubles(want.dkv), tol, tol);
        expect_close(at + " dcomp summed", to_doubles(dcomp), to_doubles(want.dcomp), tol, tol);
        expect_close(at + " dsink summed", dsink, to_doubles(want.dsink), 1e-5, 1e-4);
      }
    }
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
}

// Sizes that do not fit get an error naming the values and what works.
TEST(V4Attention, RejectsSizesThatDoNotFit) {
  const V4AttentionCase c({1, 9, 2, 4, 3, 4, 2}, DType::f32, 11);
  Tensor o = Tensor::empty(c.q.shape(), DType::f32), lse = Tensor::empty({1, 9, 2}, DType::f32);
  auto message = [&](int64_t window, int64_t ratio, const Tensor& comp, const Tensor& idx) {
    try {
      kernels::v4_attention_forward(o, lse, c.q, c.kv, comp, idx, c.sink, window, ratio, c.d.scale);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(0, 4, c.comp, c.idx).find("window 0 is below 1"), std::string::npos);
  EXPECT_NE(message(3, 1, c.comp, c.idx).find("compress ratio 1 is below 2"), std::string::npos);
  EXPECT_NE(message(3, 4, Tensor::zeros({1, 3, 4}, DType::f32), c.idx)
                .find("3 compressed entries, more than floor((P0 + S) / m) = 2"),
            std::string::npos);
  EXPECT_NE(message(3, 4, c.comp, Tensor::zeros({1, 8, 2}, DType::i32)).find("idx has shape"), std::string::npos);
  // A chunk: more key rows than queries, but its first query placed before the rows it follows.
  const Tensor kv = random_tensor({1, 12, 4}, DType::f32, 12, "kv");
  try {
    kernels::v4_attention_forward(o, lse, c.q, kv, c.comp, c.idx, c.sink, 3, 4, c.d.scale, nullptr, 2);
    ADD_FAILURE() << "3 rows before the queries accepted at first position 2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("12 key rows for 9 queries whose first sits at position 2"), std::string::npos)
        << e.what();
  }
}
