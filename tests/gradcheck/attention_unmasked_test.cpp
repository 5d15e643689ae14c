// The unmasked attention reference (ring attention's off-diagonal blocks) against first
// principles: a materialized softmax for the forward, double central differences for the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/gradcheck.h"
#include "titan/kernels/ref/attention.h"

using namespace titan;
using namespace titan::test;
using kernels::UnmaskedAttentionParams;

namespace {

UnmaskedAttentionParams dims(int64_t B, int64_t Sq, int64_t Skv, int64_t H, int64_t Hkv, int64_t Dqk, int64_t Dv,
                             double scale) {
  UnmaskedAttentionParams d;
  d.B = B, d.Sq = Sq, d.Skv = Skv, d.H = H, d.Hkv = Hkv, d.Dqk = Dqk, d.Dv = Dv, d.scale = scale;
  return d;
}

struct Inputs {
  Doubles q, k, v;
};

Inputs random_inputs(const UnmaskedAttentionParams& d, const std::string& name) {
  return {random_doubles(size_t(d.B * d.Sq * d.H * d.Dqk), 7, name + ".q", -2, 2),
          random_doubles(size_t(d.B * d.Skv * d.Hkv * d.Dqk), 7, name + ".k", -2, 2),
          random_doubles(size_t(d.B * d.Skv * d.Hkv * d.Dv), 7, name + ".v")};
}

void forward(Doubles& o, Doubles& lse, const std::vector<Doubles>& x, const UnmaskedAttentionParams& d) {
  o.assign(size_t(d.B * d.Sq * d.H * d.Dv), 0.0);
  lse.assign(size_t(d.B * d.H * d.Sq), 0.0);
  kernels::ref::attention_unmasked_forward<double>(o.data(), lse.data(), x[0].data(), x[1].data(), x[2].data(), d);
}

}  // namespace

TEST(AttentionUnmaskedReference, MatchesMaterializedSoftmax) {
  for (const UnmaskedAttentionParams& d : {dims(1, 1, 1, 1, 1, 3, 2, 0.5), dims(2, 3, 7, 4, 2, 3, 2, 0.6),
                                          dims(1, 6, 2, 3, 1, 5, 4, 1.1)}) {
    const Inputs in = random_inputs(d, "naive");
    Doubles o, lse;
    forward(o, lse, {in.q, in.k, in.v}, d);
    const int64_t group = d.H / d.Hkv;
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h)
        for (int64_t i = 0; i < d.Sq; ++i) {
          std::vector<double> s(size_t(d.Skv));
          double z = 0;
          for (int64_t j = 0; j < d.Skv; ++j) {
            double dot = 0;
            for (int64_t c = 0; c < d.Dqk; ++c)
              dot += in.q[size_t(((b * d.Sq + i) * d.H + h) * d.Dqk + c)] *
                     in.k[size_t(((b * d.Skv + j) * d.Hkv + h / group) * d.Dqk + c)];
            s[size_t(j)] = std::exp(d.scale * dot);
            z += s[size_t(j)];
          }
          EXPECT_NEAR(lse[size_t((b * d.H + h) * d.Sq + i)], std::log(z), 1e-12);
          for (int64_t c = 0; c < d.Dv; ++c) {
            double want = 0;
            for (int64_t j = 0; j < d.Skv; ++j)
              want += s[size_t(j)] / z * in.v[size_t(((b * d.Skv + j) * d.Hkv + h / group) * d.Dv + c)];
            EXPECT_NEAR(o[size_t(((b * d.Sq + i) * d.H + h) * d.Dv + c)], want, 1e-12);
          }
        }
  }
}

// On a single block, o and lse are the block's own: the backward is the gradient of its forward.
TEST(AttentionUnmaskedReference, GradientsMatchCentralDifferences) {
  for (const UnmaskedAttentionParams& d : {dims(2, 3, 5, 4, 2, 3, 2, 0.6), dims(1, 5, 2, 3, 1, 4, 5, 0.9),
                                          dims(1, 2, 4, 2, 2, 3, 3, 1.4)}) {
    const Inputs in = random_inputs(d, "grad");
    auto fwd = [d](const std::vector<Doubles>& x) {
      Doubles o, lse;
      forward(o, lse, x, d);
      return std::vector<Doubles>{o};
    };
    auto bwd = [d](const std::vector<Doubles>& x, const std::vector<Doubles>& dout) {
      Doubles o, lse;
      forward(o, lse, x, d);
      Doubles dq(x[0].size(), 0.0), dk(x[1].size(), 0.0), dv(x[2].size(), 0.0);
      kernels::ref::attention_unmasked_backward<double>(dq.data(), dk.data(), dv.data(), lse.data(), dout[0].data(),
                                                        x[0].data(), x[1].data(), x[2].data(), o.data(), d);
      return std::vector<Doubles>{dq, dk, dv};
    };
    gradcheck("unmasked", {in.q, in.k, in.v}, fwd, bwd);
  }
}
