// Gradient check of DeepSeek-V4's compressor pooling reference (double precision, central
// differences) for HCA and CSA, with a tail of tokens that feeds no entry; gradients of kv, gate
// and the position bias (which sums over sequences and entries). They start non-zero and the
// start is subtracted afterwards, checking accumulation.
#include <tuple>

#include "common/gradcheck.h"
#include "titan/kernels/ref/compressor.h"

namespace ref = titan::kernels::ref;
using titan::test::Doubles;
using titan::test::gradcheck;
using titan::test::random_doubles;

TEST(CompressorGradcheck, HcaAndCsa) {
  for (const auto& [kind, B, S, D, m] :
       {std::tuple{ref::CompressorKind::hca, int64_t(2), int64_t(7), int64_t(3), int64_t(3)},
        std::tuple{ref::CompressorKind::csa, int64_t(2), int64_t(9), int64_t(2), int64_t(2)},
        std::tuple{ref::CompressorKind::csa, int64_t(1), int64_t(4), int64_t(1), int64_t(4)}}) {
    const int64_t C = kind == ref::CompressorKind::hca ? D : 2 * D, T = S / m;
    const size_t in_size = size_t(B * S * C), bias_size = size_t(m * C), out_size = size_t(B * T * D);
    auto forward = [=](const std::vector<Doubles>& in) {
      Doubles out(out_size);
      ref::compressor_forward<double>(out.data(), in[0].data(), in[1].data(), in[2].data(), B, S, D, m, kind);
      return std::vector<Doubles>{out};
    };
    gradcheck("compressor", {random_doubles(in_size, 1, "kv"), random_doubles(in_size, 2, "gate", -2, 2),
                             random_doubles(bias_size, 3, "bias")},
              forward, [&](const std::vector<Doubles>& in, const std::vector<Doubles>& dout) {
                Doubles dkv(in_size, 0.125), dgate(in_size, 0.125), dbias(bias_size, 0.125);
                ref::compressor_backward<double>(dkv.data(), dgate.data(), dbias.data(), dout[0].data(), in[0].data(),
                                                 in[1].data(), in[2].data(), B, S, D, m, kind);
                for (Doubles* g : {&dkv, &dgate, &dbias})
                  for (double& v : *g) v -= 0.125;
                return std::vector<Doubles>{dkv, dgate, dbias};
              });
  }
}
