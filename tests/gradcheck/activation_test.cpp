// Gradient checks of the SiLU and SwiGLU references (double precision, central differences).
// Gradients start non-zero and the start is subtracted afterwards, checking accumulation.
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
