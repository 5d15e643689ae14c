// Tensor-level lightning indexer (both backends): top-k against a dense brute-force oracle, its
// padding and tie rules; the KL loss against the dense double oracle; sparse stage with K >= S
// equal to the dense stage; the Hadamard transform's orthonormality and score preservation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/indexer_oracle.h"
#include "common/kernel_check.h"
#include "common/sparse_mla_inputs.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/ref/lightning_indexer.h"
#include "titan/kernels/sparse_mla.h"

using namespace titan;
using namespace titan::kernels;
using namespace titan::test;

namespace {

Tensor from_doubles(const Doubles& v, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, DType::f32);
  for (size_t i = 0; i < v.size(); ++i) t.data<float>()[i] = float(v[i]);
  return dtype == DType::f32 ? t : t.to(dtype);
}

// The expected selection of one row from the dense scores: the K best in ascending key order,
// -1 padded (ties: lower index first).
std::vector<int32_t> oracle_row(const Doubles& scores, int64_t row, const IndexerParams& d, int64_t t) {
  const int64_t n = std::min(d.Skv, t + d.Skv - d.S + 1);
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const double* r = &scores[size_t(row * d.Skv)];
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
  order.resize(size_t(std::min(n, d.K)));
  std::sort(order.begin(), order.end());
  order.resize(size_t(d.K), -1);
  return order;
}

struct TopkCase {
  IndexerParams d;
  Tensor q, k, w;
};

TopkCase topk_case(int64_t B, int64_t S, int64_t Skv, int64_t HI, int64_t DI, int64_t K, DType dtype,
                   const std::string& name) {
  TopkCase c;
  c.d.B = B, c.d.S = S, c.d.Skv = Skv, c.d.HI = HI, c.d.DI = DI, c.d.K = K;
  c.q = random_tensor({B, S, HI, DI}, dtype, 5, name + ".q");
  c.k = random_tensor({B, Skv, DI}, dtype, 5, name + ".k");
  c.w = random_tensor({B, S, HI}, DType::f32, 5, name + ".w");
  return c;
}

std::vector<int32_t> run_topk(const TopkCase& c) {
  Tensor idx = Tensor::empty({c.d.B, c.d.S, c.d.K}, DType::i32);
  indexer_topk(idx, c.q, c.k, c.w);
  return std::vector<int32_t>(idx.data<int32_t>(), idx.data<int32_t>() + idx.numel());
}

}  // namespace

class LightningIndexer : public ::testing::TestWithParam<KernelBackend> {
 protected:
  void SetUp() override { set_kernel_backend(GetParam()); }
  void TearDown() override { set_kernel_backend(KernelBackend::fast); }
};

// Random continuous inputs have no ties (the oracle scores the rounded inputs in double; the
// kernels' f32 sums differ from it far below the gap between neighbouring scores).
TEST_P(LightningIndexer, TopkMatchesDenseOracle) {
  const std::vector<std::vector<int64_t>> shapes = {
      // B, S, Skv, HI, DI, K
      {1, 1, 1, 1, 1, 1}, {2, 37, 37, 3, 17, 8}, {1, 20, 75, 4, 64, 16}, {1, 130, 130, 2, 32, 40},
      {1, 9, 9, 2, 8, 16},  // every row has fewer valid keys than K
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& s : shapes) {
      const TopkCase c = topk_case(s[0], s[1], s[2], s[3], s[4], s[5], dtype, "topk");
      const Doubles scores = naive_scores(c.d, to_doubles(c.q), to_doubles(c.k), to_doubles(c.w));
      const std::vector<int32_t> got = run_topk(c);
      for (int64_t r = 0; r < c.d.B * c.d.S; ++r) {
        const std::vector<int32_t> want = oracle_row(scores, r, c.d, r % c.d.S);
        const std::vector<int32_t> row(got.begin() + r * c.d.K, got.begin() + (r + 1) * c.d.K);
        ASSERT_EQ(row, want) << dtype_name(dtype) << " shape " << Shape(s).str() << " row " << r;
      }
    }
  }
}

// DeepSeek-V4's CSA: the keys are compressed entries of m raw positions, visible to query t once
// their last position s m + m - 1 <= t; early queries see none (all -1). The oracle ranks the
// visible entries by the dense scores, from that definition. With the first query at position
// P0 (a context-parallel chunk), the rule holds at the query's position P0 + t.
TEST_P(LightningIndexer, TopkOverCompressedEntriesSeesOnlyCompleteWindows) {
  for (const auto [K, p0] : {std::pair<int64_t, int64_t>{3, 0}, {16, 0}, {3, 6}, {16, 13}}) {
    const int64_t m = 4;
    TopkCase c = topk_case(2, 37, 9, 3, 16, K, DType::f32, "csa");
    c.d.ratio = m;
    // Unmasked scores (naive_scores masks by the raw-key rule): every query against every entry.
    IndexerParams all = c.d;
    all.ratio = 1, all.S = 1;
    Doubles scores;
    const Doubles q = to_doubles(c.q), k = to_doubles(c.k), w = to_doubles(c.w);
    for (int64_t r = 0; r < c.d.B * c.d.S; ++r) {
      const int64_t b = r / c.d.S;
      all.B = 1;
      const Doubles row = naive_scores(all, Doubles(q.begin() + r * c.d.HI * c.d.DI, q.begin() + (r + 1) * c.d.HI * c.d.DI),
                                       Doubles(k.begin() + b * c.d.Skv * c.d.DI, k.begin() + (b + 1) * c.d.Skv * c.d.DI),
                                       Doubles(w.begin() + r * c.d.HI, w.begin() + (r + 1) * c.d.HI));
      scores.insert(scores.end(), row.begin(), row.end());
    }
    Tensor idx = Tensor::empty({c.d.B, c.d.S, K}, DType::i32);
    indexer_topk(idx, c.q, c.k, c.w, m, p0);
    for (int64_t r = 0; r < c.d.B * c.d.S; ++r) {
      const int64_t t = r % c.d.S;
      std::vector<int32_t> visible;
      for (int32_t e = 0; e < c.d.Skv; ++e)
        if (e * m + m - 1 <= p0 + t) visible.push_back(e);
      const double* row_scores = &scores[size_t(r * c.d.Skv)];
      std::stable_sort(visible.begin(), visible.end(), [&](int32_t a, int32_t b) { return row_scores[a] > row_scores[b]; });
      visible.resize(std::min(visible.size(), size_t(K)));
      std::sort(visible.begin(), visible.end());
      visible.resize(size_t(K), -1);
      const std::vector<int32_t> row(idx.data<int32_t>() + r * K, idx.data<int32_t>() + (r + 1) * K);
      ASSERT_EQ(row, visible) << "K " << K << " P0 " << p0 << " row " << r;
    }
  }
}

// Rows with fewer valid keys than K select all of them, in order, then exactly -1.
TEST_P(LightningIndexer, TopkPadsShortRowsWithMinusOne) {
  const TopkCase c = topk_case(1, 6, 6, 2, 4, 4, DType::f32, "pad");
  const std::vector<int32_t> got = run_topk(c);
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(got[size_t(t * 4 + i)], i <= t ? i : -1) << "row " << t;
  }
}

// All dot products negative: every score is exactly 0, so the K lowest keys win (ties -> lower
// index), the same on every run.
TEST_P(LightningIndexer, TopkTiesAndAllNegativeDotsPickLowerKeys) {
  TopkCase c = topk_case(1, 50, 50, 3, 16, 7, DType::f32, "ties");
  c.q = Tensor::full(c.q.shape(), 0.5, DType::f32);
  c.k = Tensor::full(c.k.shape(), -0.25, DType::f32);
  const std::vector<int32_t> got = run_topk(c);
  for (int64_t t = 0; t < 50; ++t) {
    for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(got[size_t(t * 7 + i)], i <= t ? i : -1) << "row " << t;
  }
  EXPECT_EQ(run_topk(c), got);
}

TEST_P(LightningIndexer, KlLossMatchesDenseOracle) {
  for (int64_t K : {0, 5}) {
    const IndexerProblem p = random_problem(2, 13, 17, 3, 20, 4, K ? 1 : 4, 24, K, "kl");
    const double want = naive_kl_loss(p);
    for (DType dtype : {DType::f32, DType::bf16}) {
      const auto& d = p.d;
      const auto& td = p.td;
      Tensor q = from_doubles(p.q, {d.B, d.S, d.HI, d.DI}, dtype), k = from_doubles(p.k, {d.B, d.Skv, d.DI}, dtype);
      Tensor w = from_doubles(p.w, {d.B, d.S, d.HI}, DType::f32);
      Tensor mq = from_doubles(p.mq, {d.B, d.S, td.H, td.D}, dtype);
      Tensor mk = from_doubles(p.mk, {d.B, d.Skv, td.Hk, td.D}, dtype);
      Tensor mlse = from_doubles(p.mlse, {d.B, d.S, td.H}, DType::f32);
      Tensor dq = Tensor::empty(q.shape(), dtype), dk = Tensor::empty(k.shape(), dtype),
             dw = Tensor::empty(w.shape(), DType::f32);
      double got = 0;
      if (K) {  // sparse stage: the target given per slot
        Tensor idx = Tensor::empty({d.B, d.S, K}, DType::i32);
        std::copy(p.idx.begin(), p.idx.end(), idx.data<int32_t>());
        const Tensor target = from_doubles(slot_target(p), {d.B, d.S, K}, DType::f32);
        got = indexer_kl_loss_sparse(dq, dk, dw, q, k, w, idx, target, 1.0);
      } else {
        got = indexer_kl_loss(dq, dk, dw, q, k, w, mq, mk, mlse, td.scale, 1.0);
      }
      // bf16 rounds the inputs (and so the target and scores) by ~2^-8 relative.
      const double tol = dtype == DType::f32 ? 1e-4 * (1 + want) : 3e-2 * (1 + want);
      EXPECT_NEAR(got, want, tol) << "K = " << K << " " << dtype_name(dtype);
    }
  }
}

// With K >= every row's valid count and the whole causal set listed, the sparse stage (its
// target the dense one per slot) is the dense stage: same loss, same gradients.
TEST_P(LightningIndexer, SparseWithAllKeysEqualsDense) {
  IndexerProblem p = random_problem(1, 11, 11, 2, 12, 3, 1, 16, 0, "all");
  const auto& d = p.d;
  const auto& td = p.td;
  Tensor q = from_doubles(p.q, {d.B, d.S, d.HI, d.DI}, DType::f32), k = from_doubles(p.k, {d.B, d.Skv, d.DI}, DType::f32);
  Tensor w = from_doubles(p.w, {d.B, d.S, d.HI}, DType::f32);
  Tensor mq = from_doubles(p.mq, {d.B, d.S, td.H, td.D}, DType::f32);
  Tensor mk = from_doubles(p.mk, {d.B, d.Skv, td.Hk, td.D}, DType::f32);
  Tensor mlse = from_doubles(p.mlse, {d.B, d.S, td.H}, DType::f32);
  Tensor idx = Tensor::empty({1, d.S, 16}, DType::i32);
  indexer_topk(idx, q, k, w);  // K = 16 > S: selects every causal key
  Tensor dq_d = Tensor::empty(q.shape(), DType::f32), dk_d = Tensor::empty(k.shape(), DType::f32),
         dw_d = Tensor::empty(w.shape(), DType::f32);
  Tensor dq_s = dq_d.clone(), dk_s = dk_d.clone(), dw_s = dw_d.clone();
  p.d.K = 16;
  p.idx.assign(idx.data<int32_t>(), idx.data<int32_t>() + idx.numel());
  const Tensor target = from_doubles(slot_target(p), idx.shape(), DType::f32);
  const double dense = indexer_kl_loss(dq_d, dk_d, dw_d, q, k, w, mq, mk, mlse, td.scale, 0.5);
  const double sparse = indexer_kl_loss_sparse(dq_s, dk_s, dw_s, q, k, w, idx, target, 0.5);
  EXPECT_NEAR(sparse, dense, 1e-5 * (1 + dense));
  for (const auto& [a, b] : std::vector<std::pair<Tensor*, Tensor*>>{{&dq_s, &dq_d}, {&dk_s, &dk_d}, {&dw_s, &dw_d}}) {
    const ErrorStats e = compare(to_doubles(*a), to_doubles(*b), 1e-6, 1e-5);
    EXPECT_LE(e.max_scaled, 1.0) << "worst " << e.worst;
  }
}

// All dot products negative: every ReLU is 0, so I = 0 (softmax uniform over V_t) and no
// gradient reaches q, k or w; the loss is still each row's KL(p || uniform).
TEST_P(LightningIndexer, AllNegativeDotsGiveZeroGradients) {
  IndexerProblem p = random_problem(1, 9, 9, 2, 8, 3, 3, 8, 0, "neg");
  for (double& v : p.q) v = std::fabs(v) + 0.1;
  for (double& v : p.k) v = -std::fabs(v) - 0.1;
  const auto& d = p.d;
  const auto& td = p.td;
  Tensor q = from_doubles(p.q, {d.B, d.S, d.HI, d.DI}, DType::f32), k = from_doubles(p.k, {d.B, d.Skv, d.DI}, DType::f32);
  Tensor w = from_doubles(p.w, {d.B, d.S, d.HI}, DType::f32);
  Tensor mq = from_doubles(p.mq, {d.B, d.S, td.H, td.D}, DType::f32);
  Tensor mk = from_doubles(p.mk, {d.B, d.Skv, td.Hk, td.D}, DType::f32);
  Tensor mlse = from_doubles(p.mlse, {d.B, d.S, td.H}, DType::f32);
  Tensor dq = Tensor::full(q.shape(), 7.0, DType::f32), dk = Tensor::full(k.shape(), 7.0, DType::f32),
         dw = Tensor::full(w.shape(), 7.0, DType::f32);  // overwritten, not accumulated into
  const double loss = indexer_kl_loss(dq, dk, dw, q, k, w, mq, mk, mlse, td.scale, 1.0);
  EXPECT_NEAR(loss, naive_kl_loss(p), 1e-4 * (1 + loss));
  for (const Tensor* g : {&dq, &dk, &dw}) {
    for (double v : to_doubles(*g)) ASSERT_EQ(v, 0.0);
  }
}

// The sparse stage as the model runs it: sparse attention's head_mean fed to
// indexer_kl_loss_sparse gives the loss and gradients of the definition (docs/dsa.md 6.2), the
// reference loss that recomputes the target from the main queries, latent rows and lse, at the
// the absorbed form (Hk = 1, D = Dqk) with -1, future and >= Skv slots.
TEST_P(LightningIndexer, HeadMeanTargetEqualsRecomputedTarget) {
  const int64_t B = 2, S = 40, Skv = 48, HI = 4, DI = 32, H = 5, Dqk = 64, Dv = 32;
  const double scale = 0.2;
  for (int64_t K : {12, 48}) {  // the fast kernel's gathered and blocked paths
    const Tensor q = random_tensor({B, S, HI, DI}, DType::f32, 9, "hm.q");
    const Tensor k = random_tensor({B, Skv, DI}, DType::f32, 9, "hm.k");
    const Tensor w = random_tensor({B, S, HI}, DType::f32, 9, "hm.w");
    const Tensor mq = random_tensor({B, S, H, Dqk}, DType::f32, 9, "hm.mq", -2, 2);
    const Tensor kv = random_tensor({B, Skv, Dqk}, DType::f32, 9, "hm.kv");
    const Tensor idx = random_sparse_idx(B, S, Skv, K, 9, "hm.idx", {false, 0.1});
    Tensor o = Tensor::empty({B, S, H, Dv}, DType::f32), lse = Tensor::empty({B, S, H}, DType::f32);
    Tensor head_mean = Tensor::empty({B, S, K}, DType::f32);
    sparse_mla_forward(o, lse, mq, kv, idx, Dv, scale, &head_mean);
    Tensor dq = Tensor::empty(q.shape(), DType::f32), dk = Tensor::empty(k.shape(), DType::f32),
           dw = Tensor::empty(w.shape(), DType::f32);
    const double got = indexer_kl_loss_sparse(dq, dk, dw, q, k, w, idx, head_mean, 0.3);

    IndexerParams d;
    d.B = B, d.S = S, d.Skv = Skv, d.HI = HI, d.DI = DI, d.K = K;
    IndexerTargetParams td;
    td.H = H, td.Hk = 1, td.D = Dqk, td.scale = scale;
    Tensor dq_r = dq.clone(), dk_r = dk.clone(), dw_r = dw.clone();
    const double want = ref::indexer_kl_loss<float>(
        dq_r.data<float>(), dk_r.data<float>(), dw_r.data<float>(), q.data<float>(), k.data<float>(), w.data<float>(),
        mq.data<float>(), kv.data<float>(), lse.data<float>(), idx.data<int32_t>(), d, td, 0.3);
    EXPECT_GT(want, 0.0);
    EXPECT_NEAR(got, want, 1e-5 * want) << "K = " << K;
    for (const auto& [a, b] : std::vector<std::pair<Tensor*, Tensor*>>{{&dq, &dq_r}, {&dk, &dk_r}, {&dw, &dw_r}}) {
      const ErrorStats e = compare(to_doubles(*a), to_doubles(*b), 1e-5, 1e-6);
      EXPECT_LE(e.max_scaled, 1.0) << "K = " << K << " worst " << e.worst;
    }
  }
}

// Hadamard: applying it twice restores x (orthonormal and symmetric), and rotating both q and k
// leaves every dot product, so the scores and the selection, unchanged.
TEST_P(LightningIndexer, HadamardIsSelfInverseAndPreservesScores) {
  for (int64_t n : {1, 2, 64, 128}) {
    Tensor x = random_tensor({3, 5, n}, DType::f32, 3, "x");
    const Doubles x0 = to_doubles(x);
    hadamard_transform(x);
    if (n > 1) {
      EXPECT_GT(compare(to_doubles(x), x0, 1e-6, 0).max_scaled, 1.0) << "n = " << n << " did nothing";
    }
    hadamard_transform(x);
    EXPECT_LE(compare(to_doubles(x), x0, 1e-6, 1e-6).max_scaled, 1.0) << "n = " << n;
  }
  TopkCase c = topk_case(1, 40, 40, 4, 64, 8, DType::f32, "rot");
  const Doubles before = naive_scores(c.d, to_doubles(c.q), to_doubles(c.k), to_doubles(c.w));
  const std::vector<int32_t> idx_before = run_topk(c);
  hadamard_transform(c.q);
  hadamard_transform(c.k);
  const Doubles after = naive_scores(c.d, to_doubles(c.q), to_doubles(c.k), to_doubles(c.w));
  EXPECT_LE(compare(after, before, 1e-5, 1e-5).max_scaled, 1.0);
  EXPECT_EQ(run_topk(c), idx_before);
}

TEST_P(LightningIndexer, RejectsBadShapes) {
  const TopkCase c = topk_case(1, 8, 8, 2, 4, 4, DType::f32, "bad");
  Tensor idx = Tensor::empty({1, 8, 4}, DType::i32);
  Tensor short_k = Tensor::empty({1, 7, 4}, DType::f32);  // Skv < S
  EXPECT_THROW(indexer_topk(idx, c.q, short_k, c.w), std::exception);
  Tensor bf16_k = c.k.to(DType::bf16);
  EXPECT_THROW(indexer_topk(idx, c.q, bf16_k, c.w), std::exception);
  Tensor x = Tensor::empty({2, 12}, DType::f32);
  EXPECT_THROW(hadamard_transform(x), std::exception);
}

INSTANTIATE_TEST_SUITE_P(Backends, LightningIndexer, ::testing::Values(KernelBackend::fast, KernelBackend::reference),
                         [](const ::testing::TestParamInfo<KernelBackend>& p) {
                           return p.param == KernelBackend::fast ? "fast" : "reference";
                         });
