// Gradient checks of the element-wise references (double precision, central differences).
// Gradients start at a non-zero value that is subtracted afterwards, checking that backward
// accumulates.
#include "common/gradcheck.h"
#include "titan/kernels/ref/elementwise.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

namespace {
constexpr int64_t kN = 23;
constexpr double kInitialGrad = 0.25;

Doubles fresh_grad() { return Doubles(kN, kInitialGrad); }
Doubles accumulated(Doubles g) {
  for (double& v : g) v -= kInitialGrad;
  return g;
}
}  // namespace

TEST(ElementwiseGradcheck, Add) {
  const double alpha = -0.7;
  gradcheck("add", {random_doubles(kN, 1, "a"), random_doubles(kN, 1, "b")},
            [&](const std::vector<Doubles>& in) {
              Doubles y(kN);
              ref::add<double>(y.data(), in[0].data(), in[1].data(), alpha, kN);
              return std::vector<Doubles>{y};
            },
            [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
              Doubles da = fresh_grad(), db = fresh_grad();
              ref::add_backward<double>(da.data(), db.data(), dout[0].data(), alpha, kN);
              return std::vector<Doubles>{accumulated(da), accumulated(db)};
            });
}

TEST(ElementwiseGradcheck, Mul) {
  gradcheck("mul", {random_doubles(kN, 2, "a"), random_doubles(kN, 2, "b")},
            [&](const std::vector<Doubles>& in) {
              Doubles y(kN);
              ref::mul<double>(y.data(), in[0].data(), in[1].data(), kN);
              return std::vector<Doubles>{y};
            },
            [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              Doubles da = fresh_grad(), db = fresh_grad();
              ref::mul_backward<double>(da.data(), db.data(), dout[0].data(), in[0].data(), in[1].data(), kN);
              return std::vector<Doubles>{accumulated(da), accumulated(db)};
            });
}

// scale's backward, and axpby's, are themselves axpby with beta = 1.
TEST(ElementwiseGradcheck, ScaleAndAxpby) {
  const double alpha = 1.3, beta = -0.4;
  gradcheck("scale", {random_doubles(kN, 3, "x")},
            [&](const std::vector<Doubles>& in) {
              Doubles y(kN);
              ref::scale<double>(y.data(), in[0].data(), alpha, kN);
              return std::vector<Doubles>{y};
            },
            [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
              Doubles dx = fresh_grad();
              ref::axpby<double>(dx.data(), dout[0].data(), alpha, 1.0, kN);
              return std::vector<Doubles>{accumulated(dx)};
            });
  gradcheck("axpby", {random_doubles(kN, 4, "x"), random_doubles(kN, 4, "y")},
            [&](const std::vector<Doubles>& in) {
              Doubles y = in[1];
              ref::axpby<double>(y.data(), in[0].data(), alpha, beta, kN);
              return std::vector<Doubles>{y};
            },
            [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
              Doubles dx = fresh_grad(), dy_in = fresh_grad();
              ref::axpby<double>(dx.data(), dout[0].data(), alpha, 1.0, kN);
              ref::axpby<double>(dy_in.data(), dout[0].data(), beta, 1.0, kN);
              return std::vector<Doubles>{accumulated(dx), accumulated(dy_in)};
            });
}
