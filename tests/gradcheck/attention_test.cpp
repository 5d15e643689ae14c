// The attention reference against first principles: a naive materialized-softmax formula for the
// forward, and double-precision central differences for the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/gradcheck.h"
#include "titan/kernels/ref/attention.h"

using namespace titan;
using namespace titan::test;
using kernels::AttentionParams;

namespace {

AttentionParams dims(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dqk, int64_t Dv, double scale) {
  AttentionParams d;
  d.B = B, d.S = S, d.H = H, d.Hkv = Hkv, d.Dqk = Dqk, d.Dv = Dv, d.scale = scale;
  return d;
}

// The textbook formula with the whole score matrix in memory: scores [S, S] per (b, h), -inf
// above the diagonal, softmax by row, times v.
void naive_attention(Doubles& o, Doubles& lse, const Doubles& q, const Doubles& k, const Doubles& v,
                     const AttentionParams& d) {
  o.assign(size_t(d.B * d.S * d.H * d.Dv), 0.0);
  lse.assign(size_t(d.B * d.H * d.S), 0.0);
  const int64_t group = d.H / d.Hkv;
  std::vector<double> scores(size_t(d.S * d.S));  // [S, S]
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < d.S; ++i) {
        for (int64_t j = 0; j < d.S; ++j) {
          double s = 0;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            s += q[size_t(((b * d.S + i) * d.H + h) * d.Dqk + c)] * k[size_t(((b * d.S + j) * d.Hkv + g) * d.Dqk + c)];
          }
          scores[size_t(i * d.S + j)] = j <= i ? d.scale * s : -INFINITY;
        }
      }
      for (int64_t i = 0; i < d.S; ++i) {
        double z = 0;
        for (int64_t j = 0; j < d.S; ++j) z += std::exp(scores[size_t(i * d.S + j)]);
        lse[size_t((b * d.H + h) * d.S + i)] = std::log(z);
        for (int64_t j = 0; j < d.S; ++j) {
          const double p = std::exp(scores[size_t(i * d.S + j)]) / z;
          for (int64_t c = 0; c < d.Dv; ++c) {
            o[size_t(((b * d.S + i) * d.H + h) * d.Dv + c)] += p * v[size_t(((b * d.S + j) * d.Hkv + g) * d.Dv + c)];
          }
        }
      }
    }
  }
}

struct Inputs {
  Doubles q, k, v;
};

Inputs random_inputs(const AttentionParams& d, const std::string& name) {
  return {random_doubles(size_t(d.B * d.S * d.H * d.Dqk), 7, name + ".q", -2, 2),
          random_doubles(size_t(d.B * d.S * d.Hkv * d.Dqk), 7, name + ".k", -2, 2),
          random_doubles(size_t(d.B * d.S * d.Hkv * d.Dv), 7, name + ".v")};
}

void check_against_naive(const AttentionParams& d, const std::string& name) {
  const Inputs in = random_inputs(d, name);
  Doubles o_naive, lse_naive;
  naive_attention(o_naive, lse_naive, in.q, in.k, in.v, d);
  Doubles o(o_naive.size()), lse(lse_naive.size());
  kernels::ref::attention_forward<double>(o.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), d);
  for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], o_naive[i], 1e-12) << name << " o[" << i << "]";
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], lse_naive[i], 1e-12) << name << " lse[" << i << "]";
}

// Gradients of the reference backward (which recomputes P from lse) against central differences
// of the reference forward, for q, k and v.
void check_gradients(const AttentionParams& d, const std::string& name) {
  const Inputs in = random_inputs(d, name);
  auto forward = [d](const std::vector<Doubles>& x) {
    Doubles o(size_t(d.B * d.S * d.H * d.Dv)), lse(size_t(d.B * d.H * d.S));
    kernels::ref::attention_forward<double>(o.data(), lse.data(), x[0].data(), x[1].data(), x[2].data(), d);
    return std::vector<Doubles>{o};
  };
  auto backward = [d](const std::vector<Doubles>& x, const std::vector<Doubles>& dout) {
    Doubles o(size_t(d.B * d.S * d.H * d.Dv)), lse(size_t(d.B * d.H * d.S));
    kernels::ref::attention_forward<double>(o.data(), lse.data(), x[0].data(), x[1].data(), x[2].data(), d);
    Doubles dq(x[0].size(), 0.0), dk(x[1].size(), 0.0), dv(x[2].size(), 0.0);
    kernels::ref::attention_backward<double>(dq.data(), dk.data(), dv.data(), lse.data(), dout[0].data(),
                                             x[0].data(), x[1].data(), x[2].data(), o.data(), d);
    return std::vector<Doubles>{dq, dk, dv};
  };
  gradcheck(name, {in.q, in.k, in.v}, forward, backward);
}

}  // namespace

TEST(AttentionReference, MatchesMaterializedSoftmax) {
  check_against_naive(dims(1, 1, 1, 1, 3, 2, 0.5), "single_token");
  check_against_naive(dims(2, 5, 4, 2, 3, 2, 1 / std::sqrt(3.0)), "gqa");
  check_against_naive(dims(1, 7, 3, 1, 6, 4, 0.9), "mqa_wide_v");
  check_against_naive(dims(1, 9, 2, 2, 5, 5, 1.3), "mha");
}

TEST(AttentionReference, GradientsMatchCentralDifferences) {
  check_gradients(dims(2, 5, 4, 2, 3, 2, 1 / std::sqrt(3.0)), "gqa");
  check_gradients(dims(1, 6, 3, 1, 4, 5, 0.7), "mqa_wide_v");
  check_gradients(dims(1, 4, 2, 2, 3, 3, 1.5), "mha");
}

// Backward accumulates: two calls from zero give twice the gradient of one.
TEST(AttentionReference, BackwardAccumulates) {
  const AttentionParams d = dims(1, 4, 2, 1, 3, 2, 0.6);
  const Inputs in = random_inputs(d, "accumulate");
  Doubles o(size_t(d.B * d.S * d.H * d.Dv)), lse(size_t(d.B * d.H * d.S));
  kernels::ref::attention_forward<double>(o.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), d);
  const Doubles dout = random_doubles(o.size(), 7, "accumulate.dout");
  Doubles dq(in.q.size(), 0.0), dk(in.k.size(), 0.0), dv(in.v.size(), 0.0);
  kernels::ref::attention_backward<double>(dq.data(), dk.data(), dv.data(), lse.data(), dout.data(), in.q.data(),
                                           in.k.data(), in.v.data(), o.data(), d);
  Doubles dq2 = dq, dk2 = dk, dv2 = dv;
  kernels::ref::attention_backward<double>(dq2.data(), dk2.data(), dv2.data(), lse.data(), dout.data(), in.q.data(),
                                           in.k.data(), in.v.data(), o.data(), d);
  for (size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq2[i], 2 * dq[i], 1e-14);
  for (size_t i = 0; i < dk.size(); ++i) EXPECT_NEAR(dk2[i], 2 * dk[i], 1e-14);
  for (size_t i = 0; i < dv.size(); ++i) EXPECT_NEAR(dv2[i], 2 * dv[i], 1e-14);
}
