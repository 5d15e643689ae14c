// Gradient checks of the matmul family's backward (reference twin, in double): the layouts
// derived in kernels/matmul_params.h for dA, dB, and a linear layer's dx, dw, db.
#include "common/gradcheck.h"
#include "titan/kernels/ref/matmul.h"

using namespace titan;
using namespace titan::kernels;
using titan::test::Doubles;

namespace {

struct MatmulCase {
  int64_t batch, m, n, k;
  bool trans_a, trans_b, share_b;
  float alpha;
};

std::string case_name(const MatmulCase& c) {
  return "matmul b" + std::to_string(c.batch) + " " + std::to_string(c.m) + "x" + std::to_string(c.n) + "x" +
         std::to_string(c.k) + (c.trans_a ? " ta" : "") + (c.trans_b ? " tb" : "") + (c.share_b ? " shared_b" : "");
}

}  // namespace

TEST(MatmulGradcheck, EveryTransposeBatchedAndShared) {
  const MatmulCase cases[] = {
      {1, 3, 4, 5, false, false, false, 1.0f}, {1, 3, 4, 5, true, false, false, 0.5f},
      {1, 3, 4, 5, false, true, false, 1.0f},  {1, 3, 4, 5, true, true, false, -2.0f},
      {2, 3, 2, 4, false, false, false, 1.0f}, {2, 3, 2, 4, true, true, false, 1.0f},
      {3, 2, 3, 4, false, false, true, 1.0f},  {3, 2, 3, 4, false, true, true, 0.75f},
  };
  for (const MatmulCase& c : cases) {
    const size_t a_size = size_t(c.batch * c.m * c.k), b_size = size_t((c.share_b ? 1 : c.batch) * c.k * c.n);
    MatmulParams p = dense_matmul_params(c.batch, c.m, c.n, c.k, c.trans_a, c.trans_b, c.share_b);
    p.alpha = c.alpha;
    test::gradcheck(
        case_name(c), {test::random_doubles(a_size, 1, "a"), test::random_doubles(b_size, 1, "b")},
        [&](const std::vector<Doubles>& in) {
          Doubles out(size_t(c.batch * c.m * c.n));
          ref::matmul<double, double>(out.data(), in[0].data(), in[1].data(), nullptr, p);
          return std::vector<Doubles>{out};
        },
        [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
          Doubles da(a_size, 0.0), db(b_size, 0.0);
          ref::matmul_backward<double>(da.data(), db.data(), dout[0].data(), in[0].data(), in[1].data(), c.batch, c.m,
                                       c.n, c.k, c.trans_a, c.trans_b, c.share_b, c.alpha);
          return std::vector<Doubles>{da, db};
        });
  }
}

TEST(MatmulGradcheck, LinearWithBias) {
  const int64_t shapes[][3] = {{1, 1, 1}, {4, 3, 5}, {7, 6, 2}};  // {rows, in, out}
  for (const auto& s : shapes) {
    const int64_t rows = s[0], in = s[1], out = s[2];
    test::gradcheck(
        "linear " + std::to_string(rows) + "x" + std::to_string(in) + "->" + std::to_string(out),
        {test::random_doubles(size_t(rows * in), 2, "x"), test::random_doubles(size_t(out * in), 2, "w"),
         test::random_doubles(size_t(out), 2, "bias")},
        [&](const std::vector<Doubles>& v) {
          Doubles y(size_t(rows * out));
          ref::linear_forward<double>(y.data(), v[0].data(), v[1].data(), v[2].data(), rows, in, out);
          return std::vector<Doubles>{y};
        },
        [&](const std::vector<Doubles>& v, const std::vector<Doubles>& dy) {
          Doubles dx(size_t(rows * in), 0.0), dw(size_t(out * in), 0.0), db(size_t(out), 0.0);
          ref::linear_backward<double>(dx.data(), dw.data(), db.data(), dy[0].data(), v[0].data(), v[1].data(), rows,
                                       in, out);
          return std::vector<Doubles>{dx, dw, db};
        });
  }
}
