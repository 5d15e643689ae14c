// Gradient check of the mHC Sinkhorn reference (double precision, central differences), on
// V4's shape (N = 4, 20 iterations) and awkward ones (N = 1, 3, 5; one and three iterations).
// dlogits starts non-zero and the start is subtracted afterwards, checking accumulation.
#include <tuple>

#include "common/gradcheck.h"
#include "titan/kernels/ref/sinkhorn.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

TEST(SinkhornGradcheck, UnrolledIterations) {
  for (const auto& [tokens, n, iters] : {std::tuple<int64_t, int64_t, int>{2, 4, 20}, {1, 1, 3}, {3, 3, 1}, {2, 5, 3}}) {
    const double eps = 1e-6;
    const size_t size = size_t(tokens * n * n);
    auto forward = [=](const std::vector<Doubles>& in) {
      Doubles p(size);
      ref::sinkhorn_forward<double>(p.data(), in[0].data(), tokens, n, iters, eps);
      return p;
    };
    gradcheck("sinkhorn", {random_doubles(size, 1, "logits", -3, 3)},
              [&](const std::vector<Doubles>& in) { return std::vector<Doubles>{forward(in)}; },
              [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                Doubles dl(size, 0.125);
                ref::sinkhorn_backward<double>(dl.data(), dout[0].data(), in[0].data(), tokens, n, iters, eps);
                for (double& v : dl) v -= 0.125;
                return std::vector<Doubles>{dl};
              });
  }
}
