// Gradient checks of the mHC reference maps (kernels/ref/hyper_connection.h) in double, central
// differences: the weights (a hyper-connection's three groups and the head's pre only), the
// collapse and the expand, on V4's N = 4 and awkward N = 1, 3 with odd widths. Every gradient
// starts non-zero and the start is subtracted afterwards, checking that backward accumulates.
#include <tuple>

#include "common/gradcheck.h"
#include "titan/kernels/ref/hyper_connection.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

namespace {

constexpr double kStart = 0.25;  // what every gradient buffer holds before backward

Doubles started(size_t n) { return Doubles(n, kStart); }
Doubles minus_start(Doubles v) {
  for (double& x : v) x -= kStart;
  return v;
}

}  // namespace

TEST(HyperConnectionGradcheck, Weights) {
  for (const auto& [tokens, n, head] : {std::tuple<int64_t, int64_t, bool>{3, 4, false}, {2, 1, false}, {2, 3, false},
                                        {3, 4, true}, {1, 3, true}}) {
    const int64_t m = head ? n : (n + 2) * n;
    const double eps = 1e-6;
    gradcheck("hc_weights",
              {random_doubles(size_t(tokens * m), 1, "mix", -2, 2), random_doubles(size_t(m), 2, "base"),
               random_doubles(head ? 1 : 3, 3, "scale", 0.2, 1.5)},
              [&](const std::vector<Doubles>& in) {
                Doubles w(size_t(tokens * m));
                ref::hc_weights_forward<double>(w.data(), in[0].data(), in[1].data(), in[2].data(), tokens, m, n, eps);
                return std::vector<Doubles>{w};
              },
              [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                Doubles dmix = started(in[0].size()), dbase = started(in[1].size()), dscale = started(in[2].size());
                ref::hc_weights_backward<double>(dmix.data(), dbase.data(), dscale.data(), dout[0].data(), in[0].data(),
                                                 in[1].data(), in[2].data(), tokens, m, n);
                return std::vector<Doubles>{minus_start(dmix), minus_start(dbase), minus_start(dscale)};
              });
  }
}

TEST(HyperConnectionGradcheck, CollapseAndExpand) {
  for (const auto& [tokens, n, d] : {std::tuple<int64_t, int64_t, int64_t>{2, 4, 5}, {3, 1, 7}, {1, 3, 2}}) {
    const size_t xs = size_t(tokens * n * d), ts = size_t(tokens * n), ds = size_t(tokens * d);
    gradcheck("hc_collapse", {random_doubles(xs, 4, "x"), random_doubles(ts, 5, "pre", 0, 1)},
              [&](const std::vector<Doubles>& in) {
                Doubles u(ds);
                ref::hc_collapse_forward<double>(u.data(), in[0].data(), in[1].data(), tokens, n, d);
                return std::vector<Doubles>{u};
              },
              [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                Doubles dx = started(xs), dpre = started(ts);
                ref::hc_collapse_backward<double>(dx.data(), dpre.data(), dout[0].data(), in[0].data(), in[1].data(),
                                                  tokens, n, d);
                return std::vector<Doubles>{minus_start(dx), minus_start(dpre)};
              });
    gradcheck("hc_expand",
              {random_doubles(xs, 6, "x"), random_doubles(ds, 7, "a"), random_doubles(ts, 8, "post", 0, 2),
               random_doubles(ts * size_t(n), 9, "comb", 0, 1)},
              [&](const std::vector<Doubles>& in) {
                Doubles y(xs);
                ref::hc_expand_forward<double>(y.data(), in[0].data(), in[1].data(), in[2].data(), in[3].data(), tokens,
                                               n, d);
                return std::vector<Doubles>{y};
              },
              [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                Doubles dx = started(xs), da = started(ds), dpost = started(ts), dcomb = started(ts * size_t(n));
                ref::hc_expand_backward<double>(dx.data(), da.data(), dpost.data(), dcomb.data(), dout[0].data(),
                                                in[0].data(), in[1].data(), in[2].data(), in[3].data(), tokens, n, d);
                return std::vector<Doubles>{minus_start(dx), minus_start(da), minus_start(dpost), minus_start(dcomb)};
              });
  }
}
