// Gradient checks of the SiLU and SwiGLU references (double precision, central differences).
// Gradients start non-zero and the start is subtracted afterwards, checking accumulation.
#include <cmath>

#include "common/gradcheck.h"
#include "titan/kernels/ref/activation.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

namespace {
constexpr int64_t kN = 29;
constexpr double kInitialGrad = -0.5;

Doubles fresh_grad() { return Doubles(kN, kInitialGrad); }
Doubles accumulated(Doubles g) {
  for (double& v : g) v -= kInitialGrad;
  return g;
}
}  // namespace

TEST(ActivationGradcheck, Silu) {
  gradcheck("silu", {random_doubles(kN, 1, "x", -8, 8)},
            [](const std::vector<Doubles>& in) {
              Doubles y(kN);
              ref::silu_forward<double>(y.data(), in[0].data(), kN);
              return std::vector<Doubles>{y};
            },
            [](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              Doubles dx = fresh_grad();
              ref::silu_backward<double>(dx.data(), dout[0].data(), in[0].data(), kN);
              return std::vector<Doubles>{accumulated(dx)};
            });
}

TEST(ActivationGradcheck, Swiglu) {
  gradcheck("swiglu", {random_doubles(kN, 2, "gate", -8, 8), random_doubles(kN, 2, "up", -2, 2)},
            [](const std::vector<Doubles>& in) {
              Doubles y(kN);
              ref::swiglu_forward<double>(y.data(), in[0].data(), in[1].data(), kN);
              return std::vector<Doubles>{y};
            },
            [](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
              Doubles dgate = fresh_grad(), dup = fresh_grad();
              ref::swiglu_backward<double>(dgate.data(), dup.data(), dout[0].data(), in[0].data(), in[1].data(), kN);
              return std::vector<Doubles>{accumulated(dgate), accumulated(dup)};
            });
}

// DeepSeek-V4's clamped SwiGLU (limit 0.9): gates in [-3, 3] and ups in [-2, 2], so both clamps
// cut in; no input lies within ten finite-difference steps (1e-6) of a kink.
TEST(ActivationGradcheck, SwigluLimit) {
  constexpr double kLimit = 0.9;
  std::vector<Doubles> in = {random_doubles(kN, 3, "gate", -3, 3), random_doubles(kN, 3, "up", -2, 2)};
  int gates_clamped = 0, ups_clamped = 0;
  for (int64_t i = 0; i < kN; ++i) {
    gates_clamped += in[0][size_t(i)] > kLimit, ups_clamped += std::fabs(in[1][size_t(i)]) > kLimit;
    ASSERT_GT(std::fabs(in[0][size_t(i)] - kLimit), 1e-5);
    ASSERT_GT(std::fabs(std::fabs(in[1][size_t(i)]) - kLimit), 1e-5);
  }
  ASSERT_GT(gates_clamped, 0);
  ASSERT_GT(ups_clamped, 0);
  gradcheck("swiglu_limit", in,
            [](const std::vector<Doubles>& x) {
              Doubles y(kN);
              ref::swiglu_forward<double>(y.data(), x[0].data(), x[1].data(), kN, kLimit);
              return std::vector<Doubles>{y};
            },
            [](const std::vector<Doubles>& x, const std::vector<Doubles>& dout) {
              Doubles dgate = fresh_grad(), dup = fresh_grad();
              ref::swiglu_backward<double>(dgate.data(), dup.data(), dout[0].data(), x[0].data(), x[1].data(), kN,
                                           kLimit);
              return std::vector<Doubles>{accumulated(dgate), accumulated(dup)};
            });
}
