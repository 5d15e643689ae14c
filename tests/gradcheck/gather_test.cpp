// Gradient checks of the gather / scatter-add reference twins in double, with repeated indices
// (so scatter-adds really sum) and weights.
#include "common/gradcheck.h"
#include "titan/kernels/ref/gather.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

namespace {
const int64_t kR = 4, kD = 3;
const std::vector<int32_t> kIdx = {2, 0, 2, 3, 2};  // M = 5; row 1 never used
const int64_t kM = int64_t(kIdx.size());
}  // namespace

TEST(GatherGradcheck, GatherRows) {
  gradcheck(
      "gather", {random_doubles(size_t(kR * kD), 1, "x"), random_doubles(size_t(kM), 1, "w")},
      [](const std::vector<Doubles>& in) {
        Doubles y(size_t(kM * kD));
        ref::gather_rows_forward<double>(y.data(), in[0].data(), kIdx.data(), in[1].data(), kM, kD);
        return std::vector<Doubles>{y};
      },
      [](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        Doubles dx(size_t(kR * kD), 0.0), dw(size_t(kM), 0.0);
        ref::gather_rows_backward<double>(dx.data(), dw.data(), dout[0].data(), in[0].data(), kIdx.data(), in[1].data(),
                                          kR, kM, kD);
        return std::vector<Doubles>{dx, dw};
      });
}

TEST(GatherGradcheck, ScatterAddRows) {
  const Doubles y0 = random_doubles(size_t(kR * kD), 1, "y0");  // scatter-add adds onto y
  gradcheck(
      "scatter_add", {random_doubles(size_t(kM * kD), 1, "x"), random_doubles(size_t(kM), 1, "w")},
      [&](const std::vector<Doubles>& in) {
        Doubles y = y0;
        ref::scatter_add_rows_forward<double>(y.data(), in[0].data(), kIdx.data(), in[1].data(), kR, kM, kD);
        return std::vector<Doubles>{y};
      },
      [](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
        Doubles dx(size_t(kM * kD), 0.0), dw(size_t(kM), 0.0);
        ref::scatter_add_rows_backward<double>(dx.data(), dw.data(), dout[0].data(), in[0].data(), kIdx.data(),
                                               in[1].data(), kM, kD);
        return std::vector<Doubles>{dx, dw};
      });
}
