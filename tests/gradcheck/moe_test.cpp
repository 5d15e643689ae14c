// Gradient checks in double of the MoE kernels' reference twins (grouped matmul, router with
// its balance loss, permute / unpermute) and of the whole routed path composed from them
// (common/moe_reference.h). Random inputs have no near-ties between chosen and passed-over
// experts, so the small steps of the finite differences never change the choice.
#include "common/gradcheck.h"
#include "common/moe_reference.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

namespace {

kernels::RouterParams router(int64_t experts, int64_t k, kernels::RouterScore score, int64_t groups, int64_t keep,
                             bool norm, double scale) {
  kernels::RouterParams p;
  p.experts = experts, p.top_k = k, p.score = score, p.n_groups = groups, p.topk_groups = keep;
  p.route_norm = norm, p.route_scale = scale;
  return p;
}

void check_router(const std::string& name, const kernels::RouterParams& p) {
  const int64_t batch = 2, seq = 5, n = batch * seq;
  const Doubles bias = random_doubles(size_t(p.experts), 3, "bias", -0.05, 0.05);
  auto forward = [&](const std::vector<Doubles>& in) {
    Doubles scores(size_t(n * p.experts)), weights(size_t(n * p.top_k));
    std::vector<int32_t> idx(size_t(n * p.top_k));
    ref::router_forward<double>(scores.data(), idx.data(), weights.data(), in[0].data(), bias.data(), n, p);
    return std::pair{weights, std::pair{scores, idx}};
  };
  gradcheck(
      name, {random_doubles(size_t(n * p.experts), 1, "logits", -3, 3)},
      [&](const std::vector<Doubles>& in) {
        auto [weights, rest] = forward(in);
        const double aux = ref::router_aux_loss<double>(rest.first.data(), rest.second.data(), batch, seq, p);
        return std::vector<Doubles>{weights, {aux}};
      },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        auto [weights, rest] = forward(in);
        Doubles dscores(size_t(n * p.experts), 0.0), dlogits(size_t(n * p.experts), 0.0);
        ref::router_aux_loss_backward<double>(dscores.data(), dout[1][0], rest.first.data(), rest.second.data(), batch,
                                              seq, p);
        ref::router_backward<double>(dlogits.data(), dout[0].data(), dscores.data(), rest.first.data(),
                                     rest.second.data(), n, p);
        return std::vector<Doubles>{dlogits};
      });
}

// Expert choices [N, k] and their sort, for the permute checks.
const int64_t kN = 4, kK = 2, kE = 3, kD = 3;
kernels::ExpertDispatch dispatch() {
  Tensor idx = Tensor::empty({kN, kK}, DType::i32);
  const int32_t choices[kN * kK] = {2, 0, 0, 1, 2, 1, 0, 2};
  std::copy(choices, choices + kN * kK, idx.data<int32_t>());
  return kernels::moe_sort_by_expert(idx, kE);
}

}  // namespace

TEST(MoeGradcheck, GroupedMatmul) {
  const int64_t e = 3, n = 3, k = 4;
  const std::vector<int64_t> offsets = {0, 2, 2, 5};  // expert 1 gets no tokens
  const int64_t m = offsets.back();
  gradcheck(
      "grouped_matmul", {random_doubles(size_t(m * k), 1, "a"), random_doubles(size_t(e * n * k), 1, "w")},
      [&](const std::vector<Doubles>& in) {
        Doubles c(size_t(m * n));
        ref::grouped_matmul_forward<double>(c.data(), in[0].data(), in[1].data(), offsets.data(), e, n, k);
        return std::vector<Doubles>{c};
      },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        Doubles da(size_t(m * k), 0.0), dw(size_t(e * n * k), 0.0);
        ref::grouped_matmul_backward<double>(da.data(), dw.data(), dout[0].data(), in[0].data(), in[1].data(),
                                             offsets.data(), e, n, k);
        return std::vector<Doubles>{da, dw};
      });
}

TEST(MoeGradcheck, RouterSoftmax) {
  check_router("router_softmax", router(8, 3, kernels::RouterScore::softmax, 1, 1, false, 1.0));
}

TEST(MoeGradcheck, RouterSigmoidGroupLimitedNormalized) {
  check_router("router_sigmoid_groups", router(8, 3, kernels::RouterScore::sigmoid, 4, 2, true, 2.5));
}

TEST(MoeGradcheck, RouterSoftmaxNormalized) {
  check_router("router_softmax_norm", router(6, 2, kernels::RouterScore::softmax, 3, 2, true, 16.0));
}

TEST(MoeGradcheck, RouterSqrtSoftplusNormalized) {
  check_router("router_sqrtsoftplus_norm", router(8, 3, kernels::RouterScore::sqrtsoftplus, 1, 1, true, 1.5));
}

// Hash routing: a given choice with a repeated expert (token 0 picks expert 2 twice), weights
// through sqrtsoftplus, with logits past softplus' threshold (20) and far below 0.
TEST(MoeGradcheck, RouterHashWeights) {
  const kernels::RouterParams p = router(6, 3, kernels::RouterScore::sqrtsoftplus, 1, 1, true, 1.5);
  const int64_t n = 4;
  const std::vector<int32_t> idx = {2, 2, 5, 0, 1, 4, 3, 3, 3, 5, 0, 1};
  Doubles logits = random_doubles(size_t(n * p.experts), 2, "logits", -3, 3);
  logits[2] = 24.5, logits[6 + 1] = -25, logits[12 + 3] = 21.5;
  auto forward = [&](const std::vector<Doubles>& in) {
    Doubles scores(size_t(n * p.experts)), weights(size_t(n * p.top_k));
    ref::router_weights_forward<double>(scores.data(), weights.data(), in[0].data(), idx.data(), n, p);
    return std::pair{weights, scores};
  };
  gradcheck(
      "router_hash_weights", {logits},
      [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{forward(in).first}; },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        const Doubles scores = forward(in).second;
        Doubles dlogits(size_t(n * p.experts), 0.0);
        ref::router_backward<double>(dlogits.data(), dout[0].data(), nullptr, scores.data(), idx.data(), n, p);
        return std::vector<Doubles>{dlogits};
      });
}

TEST(MoeGradcheck, Permute) {
  const kernels::ExpertDispatch disp = dispatch();
  const int32_t* pos = disp.pos.data<int32_t>();
  gradcheck(
      "moe_permute", {random_doubles(size_t(kN * kD), 1, "x")},
      [&](const std::vector<Doubles>& in) {
        Doubles xs(size_t(kN * kK * kD));
        ref::moe_permute_forward<double>(xs.data(), in[0].data(), pos, kN, kK, kD);
        return std::vector<Doubles>{xs};
      },
      [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
        Doubles dx(size_t(kN * kD), 0.0);
        ref::moe_permute_backward<double>(dx.data(), dout[0].data(), pos, kN, kK, kD);
        return std::vector<Doubles>{dx};
      });
}

TEST(MoeGradcheck, Unpermute) {
  const kernels::ExpertDispatch disp = dispatch();
  const int32_t* pos = disp.pos.data<int32_t>();
  gradcheck(
      "moe_unpermute", {random_doubles(size_t(kN * kK * kD), 1, "out"), random_doubles(size_t(kN * kK), 1, "w")},
      [&](const std::vector<Doubles>& in) {
        Doubles y(size_t(kN * kD));
        ref::moe_unpermute_forward<double>(y.data(), in[0].data(), pos, in[1].data(), kN, kK, kD);
        return std::vector<Doubles>{y};
      },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        Doubles dout_rows(size_t(kN * kK * kD)), dw(size_t(kN * kK), 0.0);
        ref::moe_unpermute_backward<double>(dout_rows.data(), dw.data(), dout[0].data(), in[0].data(), pos, in[1].data(),
                                            kN, kK, kD);
        return std::vector<Doubles>{dout_rows, dw};
      });
}

// The whole routed path: router (f32 in the module, double here), experts, combine, balance loss.
TEST(MoeGradcheck, RoutedLayer) {
  for (const bool sigmoid : {false, true}) {
    MoeReference r;
    r.dims = {2, 3, 5, 4,
              sigmoid ? router(8, 3, kernels::RouterScore::sigmoid, 4, 2, true, 2.5)
                      : router(6, 2, kernels::RouterScore::softmax, 1, 1, false, 1.0),
              sigmoid ? 0.1 : 0.0};
    const int64_t t = r.dims.tokens(), e = r.dims.p.experts, d = r.dims.d, f = r.dims.f;
    r.bias = random_doubles(size_t(e), 5, "bias", -0.05, 0.05);
    gradcheck(
        sigmoid ? "moe_layer_sigmoid" : "moe_layer_softmax",
        {random_doubles(size_t(t * d), 1, "x"), random_doubles(size_t(e * d), 1, "gate"),
         random_doubles(size_t(e * f * d), 1, "w1"), random_doubles(size_t(e * d * f), 1, "w2"),
         random_doubles(size_t(e * f * d), 1, "w3")},
        [&](const std::vector<Doubles>& in) { return r.forward(in); },
        [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) { return r.backward(in, dout); }, 1e-6,
        1e-5);
  }
}
