// Gradient checks of DeepSeek-V4's attention (kernels/v4_attention.h). The reference twin in
// double against central differences of its forward, w.r.t. q, kv, the compressed entries and the
// sink, for HCA, CSA (future, -1 and out-of-range slots, more slots than visible entries), a
// sliding-only layer (no entry), one head, a window wider than S and S not a multiple of m, and
// context-parallel chunks (raw key rows before the queries, the first query past position 0). Then
// the autograd op (f32 fused kernels through the tape) against f32 central differences.
#include <gtest/gtest.h>

#include "common/gradcheck.h"
#include "common/v4_attention_inputs.h"
#include "titan/autograd/ops.h"
#include "titan/kernels/ref/v4_attention.h"

using namespace titan;
using namespace titan::test;

namespace {

void check_reference(const std::vector<int64_t>& dims, const std::string& name) {
  const V4AttentionCase c(dims, DType::f32, 11);
  const kernels::V4AttentionParams d = c.d;
  const int32_t* idx = c.idx.defined() ? c.idx.data<int32_t>() : nullptr;
  const size_t o_n = size_t(d.B * d.S * d.H * d.D), lse_n = size_t(d.B * d.S * d.H);
  auto forward = [d, idx, o_n, lse_n](const std::vector<Doubles>& x) {
    Doubles o(o_n), lse(lse_n);
    kernels::ref::v4_attention_forward<double>(o.data(), lse.data(), nullptr, x[0].data(), x[1].data(), x[2].data(), idx,
                                               x[3].data(), d);
    return std::vector<Doubles>{o};
  };
  auto backward = [d, idx, o_n, lse_n](const std::vector<Doubles>& x, const std::vector<Doubles>& dout) {
    Doubles o(o_n), lse(lse_n);
    kernels::ref::v4_attention_forward<double>(o.data(), lse.data(), nullptr, x[0].data(), x[1].data(), x[2].data(), idx,
                                               x[3].data(), d);
    Doubles dq(x[0].size()), dkv(x[1].size()), dcomp(x[2].size()), dsink(x[3].size());
    kernels::ref::v4_attention_backward<double>(dq.data(), dkv.data(), dcomp.data(), dsink.data(), dout[0].data(),
                                                x[0].data(), x[1].data(), x[2].data(), idx, x[3].data(), o.data(),
                                                lse.data(), d);
    return std::vector<Doubles>{dq, dkv, dcomp, dsink};
  };
  gradcheck(name,
            {random_doubles(size_t(d.B * d.S * d.H * d.D), 11, name + ".q", -2, 2),
             random_doubles(size_t(d.B * d.Skv * d.D), 11, name + ".kv", -2, 2),
             random_doubles(size_t(d.B * d.T * d.D), 11, name + ".comp", -2, 2),
             random_doubles(size_t(d.H), 11, name + ".sink", -1, 1)},
            forward, backward);
}

}  // namespace

TEST(V4AttentionReference, GradientsMatchCentralDifferences) {
  // dims {B, S, H, D, W, m, K}
  check_reference({1, 1, 1, 3, 1, 2, 0}, "single_token");
  check_reference({2, 11, 2, 5, 4, 4, 0}, "hca_tail");                // S mod m = 3
  check_reference({1, 13, 3, 4, 3, 3, 6}, "csa_more_slots_than_entries");
  check_reference({1, 9, 1, 6, 16, 2, 2}, "csa_window_wider_than_s");
  check_reference({1, 6, 2, 3, 2, 8, 0}, "sliding_only");             // S < m: no entry
  // {.., E, P0}: E raw key rows before the queries, the first query at position P0
  check_reference({1, 6, 2, 4, 3, 2, 3, 2, 10}, "csa_chunk");
  check_reference({2, 5, 2, 3, 4, 3, 0, 3, 9}, "hca_chunk");
  check_reference({1, 4, 1, 3, 3, 4, 0, 2, 2}, "sliding_chunk");       // P0 + S < m: no entry
}

// The fused autograd op (f32) through the tape: L = sum(o * probe) against central differences
// with a 1e-3 step (f32 rounding over the step bounds the tolerance at 2e-3).
TEST(V4AttentionAutograd, GradientsMatchCentralDifferences) {
  for (const auto& dims :
       std::vector<std::vector<int64_t>>{{1, 10, 2, 4, 3, 4, 0}, {1, 11, 3, 5, 4, 3, 3}, {1, 7, 2, 4, 3, 3, 3, 2, 8}}) {
    const V4AttentionCase c(dims, DType::f32, 13);
    const kernels::V4AttentionParams d = c.d;
    const Tensor probe = random_tensor(c.q.shape(), DType::f32, 14, "probe");
    std::vector<Tensor> inputs = {c.q.clone(), c.kv.clone(), c.comp.clone(), c.sink.clone()};
    auto loss = [&](const std::vector<Tensor>& in, std::vector<autograd::Variable>* leaves) {
      std::vector<autograd::Variable> v;
      for (const Tensor& t : in) v.emplace_back(t, leaves != nullptr);
      autograd::Variable o = autograd::v4_attention(v[0], v[1], v[2], c.idx, v[3], d.W, d.ratio, d.scale, nullptr, d.P0);
      double l = 0;
      for (int64_t i = 0; i < o.value().numel(); ++i) l += double(o.value().data<float>()[i]) * probe.data<float>()[i];
      if (leaves) autograd::backward(o, probe), *leaves = v;
      return l;
    };
    std::vector<autograd::Variable> leaves;
    loss(inputs, &leaves);
    const double eps = 1e-3;
    for (size_t a = 0; a < inputs.size(); ++a) {
      double worst = 0;
      for (int64_t i = 0; i < inputs[a].numel(); ++i) {
        float* x = inputs[a].data<float>() + i;
        const float saved = *x;
        *x = saved + float(eps);
        const double lp = loss(inputs, nullptr);
        *x = saved - float(eps);
        const double lm = loss(inputs, nullptr);
        *x = saved;
        const double numeric = (lp - lm) / (2 * eps), analytic = leaves[a].grad().data<float>()[i];
        worst = std::max(worst, std::fabs(numeric - analytic) / (1.0 + std::fabs(numeric)));
      }
      EXPECT_LE(worst, 2e-3) << "input " << a;
    }
  }
}
