// Gradient check of the cross-entropy reference twin in double: d(per-token loss)/d(logits),
// with an ignored row (which must get no gradient) and per-token upstream gradients.
#include "common/gradcheck.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/ref/cross_entropy.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

TEST(CrossEntropyGradcheck, PerTokenLoss) {
  const int64_t n = 4, v = 7;
  const std::vector<int32_t> targets = {3, kernels::kIgnoreIndex, 0, 6};
  gradcheck(
      "cross_entropy", {random_doubles(size_t(n * v), 1, "logits", -3, 3)},
      [&](const std::vector<Doubles>& in) {
        Doubles loss(static_cast<size_t>(n)), lse(static_cast<size_t>(n));
        ref::cross_entropy_forward<double>(loss.data(), lse.data(), in[0].data(), targets.data(), n, v,
                                           kernels::kIgnoreIndex);
        return std::vector<Doubles>{loss};
      },
      [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        Doubles loss(static_cast<size_t>(n)), lse(static_cast<size_t>(n)), dlogits(static_cast<size_t>(n * v));
        ref::cross_entropy_forward<double>(loss.data(), lse.data(), in[0].data(), targets.data(), n, v,
                                           kernels::kIgnoreIndex);
        ref::cross_entropy_backward<double>(dlogits.data(), in[0].data(), targets.data(), lse.data(), dout[0].data(),
                                            1.0, n, v, kernels::kIgnoreIndex);
        return std::vector<Doubles>{dlogits};
      });
}
