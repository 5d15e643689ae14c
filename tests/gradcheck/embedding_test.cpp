// Gradient check of the embedding reference twin in double: repeated ids sum their rows' gradients,
// and an unused row gets none.
#include "common/gradcheck.h"
#include "titan/kernels/ref/embedding.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

namespace {
const int64_t kV = 4, kD = 3;
const std::vector<int32_t> kIds = {2, 0, 2, 3, 2};  // N = 5; row 1 never used
const int64_t kN = int64_t(kIds.size());
}  // namespace

TEST(EmbeddingGradcheck, RepeatedIds) {
  gradcheck(
      "embedding", {random_doubles(size_t(kV * kD), 1, "table")},
      [](const std::vector<Doubles>& in) {
        Doubles y(size_t(kN * kD));
        ref::embedding_forward<double>(y.data(), in[0].data(), kIds.data(), kN, kD);
        return std::vector<Doubles>{y};
      },
      [](const std::vector<Doubles>&, const std::vector<Doubles>& dout) {
        Doubles dtable(size_t(kV * kD), 0.0);
        ref::embedding_backward<double>(dtable.data(), dout[0].data(), kIds.data(), kN, kD);
        return std::vector<Doubles>{dtable};
      });
}
