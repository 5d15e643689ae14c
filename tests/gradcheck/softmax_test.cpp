// Gradient check of the softmax reference (double precision, central differences). dx starts
// non-zero and the start is subtracted afterwards, checking accumulation.
#include <utility>

#include "common/gradcheck.h"
#include "titan/kernels/ref/softmax.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

TEST(SoftmaxGradcheck, LastDim) {
  for (const auto& [N, D] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {2, 33}}) {
    auto forward = [N, D](const std::vector<Doubles>& in) {
      Doubles y(size_t(N * D));
      ref::softmax_forward<double>(y.data(), in[0].data(), N, D);
      return y;
    };
    gradcheck("softmax", {random_doubles(size_t(N * D), 1, "x", -5, 5)},
              [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{forward(in)}; },
              [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                const Doubles y = forward(in);
                Doubles dx(size_t(N * D), 0.125);
                ref::softmax_backward<double>(dx.data(), dout[0].data(), y.data(), N, D);
                for (double& v : dx) v -= 0.125;
                return std::vector<Doubles>{dx};
              });
  }
}
