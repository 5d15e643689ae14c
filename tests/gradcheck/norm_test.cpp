// Gradient checks of the RMSNorm and LayerNorm references (double precision, central
// differences) with respect to x, w and b. Gradients start non-zero and the start is subtracted
// afterwards, checking accumulation.
#include "common/gradcheck.h"
#include "titan/kernels/ref/norm.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

namespace {
constexpr int64_t kN = 3, kD = 9;
constexpr double kEps = 1e-5, kInitialGrad = 0.5;

Doubles fresh_grad(int64_t n) { return Doubles(size_t(n), kInitialGrad); }
Doubles accumulated(Doubles g) {
  for (double& v : g) v -= kInitialGrad;
  return g;
}
}  // namespace

TEST(NormGradcheck, RmsNorm) {
  struct Out { Doubles y, rstd; };
  auto forward = [](const std::vector<Doubles>& in) {
    Out o{Doubles(kN * kD), Doubles(kN)};
    ref::rmsnorm_forward<double>(o.y.data(), o.rstd.data(), in[0].data(), in[1].data(), kN, kD, kEps);
    return o;
  };
  gradcheck("rmsnorm", {random_doubles(kN * kD, 1, "x", -2, 2), random_doubles(kD, 1, "w", 0.5, 1.5)},
            [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{forward(in).y}; },
            [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              const Out o = forward(in);
              Doubles dx = fresh_grad(kN * kD), dw = fresh_grad(kD);
              ref::rmsnorm_backward<double>(dx.data(), dw.data(), o.rstd.data(), dout[0].data(), in[0].data(),
                                            in[1].data(), kN, kD);
              return std::vector<Doubles>{accumulated(dx), accumulated(dw)};
            });
}

TEST(NormGradcheck, LayerNorm) {
  struct Out { Doubles y, mean, rstd; };
  auto forward = [](const std::vector<Doubles>& in) {
    Out o{Doubles(kN * kD), Doubles(kN), Doubles(kN)};
    ref::layernorm_forward<double>(o.y.data(), o.mean.data(), o.rstd.data(), in[0].data(), in[1].data(),
                                   in[2].data(), kN, kD, kEps);
    return o;
  };
  gradcheck("layernorm",
            {random_doubles(kN * kD, 2, "x", -1, 3), random_doubles(kD, 2, "w", 0.5, 1.5),
             random_doubles(kD, 2, "b", -0.5, 0.5)},
            [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{forward(in).y}; },
            [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              const Out o = forward(in);
              Doubles dx = fresh_grad(kN * kD), dw = fresh_grad(kD), db = fresh_grad(kD);
              ref::layernorm_backward<double>(dx.data(), dw.data(), db.data(), o.mean.data(), o.rstd.data(),
                                              dout[0].data(), in[0].data(), in[1].data(), kN, kD);
              return std::vector<Doubles>{accumulated(dx), accumulated(dw), accumulated(db)};
            });
}
