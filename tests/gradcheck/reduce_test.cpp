// Gradient checks of the reduction references (double precision, central differences).
// Gradients start non-zero and the start is subtracted afterwards, checking accumulation.
#include "common/gradcheck.h"
#include "titan/kernels/ref/reduce.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

namespace {
constexpr int64_t kN = 4, kD = 11;
constexpr double kInitialGrad = 0.5;

Doubles fresh_grad(int64_t n) { return Doubles(size_t(n), kInitialGrad); }
Doubles accumulated(Doubles g) {
  for (double& v : g) v -= kInitialGrad;
  return g;
}
}  // namespace

TEST(ReduceGradcheck, SumAndMeanRows) {
  for (const bool mean : {false, true}) {
    gradcheck(mean ? "mean_rows" : "sum_rows", {random_doubles(kN * kD, 1, "x")},
              [&](const std::vector<Doubles>& in) {
                Doubles y(kN);
                (mean ? ref::mean_rows<double> : ref::sum_rows<double>)(y.data(), in[0].data(), kN, kD);
                return std::vector<Doubles>{y};
              },
              [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
                Doubles dx = fresh_grad(kN * kD);
                ref::sum_rows_backward<double>(dx.data(), dout[0].data(), mean ? 1.0 / kD : 1.0, kN, kD);
                return std::vector<Doubles>{accumulated(dx)};
              });
  }
}

// Distinct random values keep every argmax more than eps away from a tie.
TEST(ReduceGradcheck, MaxRows) {
  auto forward = [](const std::vector<Doubles>& in, std::vector<int32_t>& argmax) {
    Doubles y(kN);
    ref::max_rows<double>(y.data(), argmax.data(), in[0].data(), kN, kD);
    return y;
  };
  gradcheck("max_rows", {random_doubles(kN * kD, 2, "x")},
            [&](const std::vector<Doubles>& in) {
              std::vector<int32_t> argmax(kN);
              return std::vector<Doubles>{forward(in, argmax)};
            },
            [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              std::vector<int32_t> argmax(kN);
              forward(in, argmax);
              Doubles dx = fresh_grad(kN * kD);
              ref::max_rows_backward<double>(dx.data(), argmax.data(), dout[0].data(), kN, kD);
              return std::vector<Doubles>{accumulated(dx)};
            });
}

// sum_all's backward is sum_rows_backward over one row with per-row gradient 1 scaled by dy.
TEST(ReduceGradcheck, SumAll) {
  const int64_t n = kN * kD;
  gradcheck("sum_all", {random_doubles(n, 3, "x")},
            [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{{ref::sum_all<double>(in[0].data(), n)}}; },
            [&](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
              Doubles dx = fresh_grad(n);
              const double one = 1;
              ref::sum_rows_backward<double>(dx.data(), &one, dout[0][0], 1, n);
              return std::vector<Doubles>{accumulated(dx)};
            });
}
