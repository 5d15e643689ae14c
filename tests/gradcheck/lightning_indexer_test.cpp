// The indexer KL loss reference (double) against first principles: its loss equals the dense
// materialized oracle, and its fused gradients (closed form g = softmax(I) - p, docs/dsa.md 6.4) equal
// central differences of the loss w.r.t. q, k and w with the selection S_t and the target held
// fixed, in both the dense warm-up and the sparse stage (target recomputed, and given per slot).
#include <gtest/gtest.h>

#include "common/indexer_oracle.h"
#include "titan/kernels/ref/lightning_indexer.h"

using namespace titan;
using namespace titan::test;

namespace {

double ref_loss(const IndexerProblem& p, const Doubles& q, const Doubles& k, const Doubles& w, Doubles* dq,
                Doubles* dk, Doubles* dw, double grad_scale) {
  Doubles dq_s(q.size()), dk_s(k.size()), dw_s(w.size());
  const double loss = kernels::ref::indexer_kl_loss<double>(
      dq_s.data(), dk_s.data(), dw_s.data(), q.data(), k.data(), w.data(), p.mq.data(), p.mk.data(), p.mlse.data(),
      p.idx.empty() ? nullptr : p.idx.data(), p.d, p.td, grad_scale);
  if (dq) *dq = dq_s, *dk = dk_s, *dw = dw_s;
  return loss;
}

void check(const IndexerProblem& p, const std::string& name) {
  EXPECT_NEAR(ref_loss(p, p.q, p.k, p.w, nullptr, nullptr, nullptr, 1.0), naive_kl_loss(p), 1e-10) << name;
  gradcheck(
      name, {p.q, p.k, p.w},
      [&](const std::vector<Doubles>& in) {
        return std::vector<Doubles>{{ref_loss(p, in[0], in[1], in[2], nullptr, nullptr, nullptr, 1.0)}};
      },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& probe) {
        Doubles dq, dk, dw;
        // The probe on the scalar loss is the gradient's scale.
        ref_loss(p, in[0], in[1], in[2], &dq, &dk, &dw, probe[0][0]);
        return std::vector<Doubles>{dq, dk, dw};
      },
      1e-6, 1e-6);
}

}  // namespace

TEST(IndexerKlLossGrad, DenseStage) {
  check(random_problem(2, 7, 7, 3, 5, 4, 4, 6, 0, "dense_mha"), "dense, Hk = H");
  check(random_problem(1, 6, 9, 2, 8, 3, 1, 5, 0, "dense_mqa"), "dense, Hk = 1, Skv > S");
}

// The sparse-stage loss with its target given per slot (held fixed): dq, dk, dw against central
// differences, and the loss against the dense oracle (the target the head mean per slot).
TEST(IndexerKlLossGrad, SparseStageGivenTarget) {
  for (const IndexerProblem& p : {random_problem(2, 9, 9, 3, 5, 4, 1, 6, 4, "given_mqa"),
                                  random_problem(1, 6, 8, 2, 7, 2, 2, 4, 3, "given_mha")}) {
    const Doubles target = slot_target(p);
    auto loss = [&](const std::vector<Doubles>& in, Doubles* dq, Doubles* dk, Doubles* dw, double grad_scale) {
      Doubles dq_s(in[0].size()), dk_s(in[1].size()), dw_s(in[2].size());
      const double l = kernels::ref::indexer_kl_loss_sparse<double>(dq_s.data(), dk_s.data(), dw_s.data(),
                                                                    in[0].data(), in[1].data(), in[2].data(),
                                                                    p.idx.data(), target.data(), p.d, grad_scale);
      if (dq) *dq = dq_s, *dk = dk_s, *dw = dw_s;
      return l;
    };
    EXPECT_NEAR(loss({p.q, p.k, p.w}, nullptr, nullptr, nullptr, 1.0), naive_kl_loss(p), 1e-10);
    gradcheck(
        "sparse, given target", {p.q, p.k, p.w},
        [&](const std::vector<Doubles>& in) {
          return std::vector<Doubles>{{loss(in, nullptr, nullptr, nullptr, 1.0)}};
        },
        [&](const std::vector<Doubles>& in, const std::vector<Doubles>& probe) {
          Doubles dq, dk, dw;
          loss(in, &dq, &dk, &dw, probe[0][0]);
          return std::vector<Doubles>{dq, dk, dw};
        },
        1e-6, 1e-6);
  }
}

TEST(IndexerKlLossGrad, SparseStage) {
  check(random_problem(2, 9, 9, 3, 5, 4, 1, 6, 4, "sparse_mqa"), "sparse, K = 4");
  check(random_problem(1, 6, 8, 2, 7, 2, 2, 4, 3, "sparse_mha"), "sparse, Hk = H, Skv > S");
}
