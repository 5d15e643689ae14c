// Rows of the op table for kernels/compressor (DeepSeek-V4's compressed entries). dims =
// {kind (0 HCA, 1 CSA), B, S, D, m}: V4's ratios (CSA m = 4, HCA m = 128 at a short length),
// S not a multiple of m (a tail that feeds no entry), S < m (no entry), D around the fast
// kernel's 64-channel blocks (1, 63, 65, 130). Gates span [-6, 6], slot 0 of every window's gate
// +60 (overflows exp unless each channel's max is subtracted); f32 only.
#include "common/backend_compare.h"
#include "titan/kernels/compressor.h"

using namespace titan;
using namespace titan::test;

namespace {

struct Inputs {
  Tensor kv, gate, bias;
  kernels::CompressorKind kind;
  int64_t m, entries, D;
};

Inputs inputs(const OpInput& in) {
  const auto kind = in.dims[0] == 0 ? kernels::CompressorKind::hca : kernels::CompressorKind::csa;
  const int64_t B = in.dims[1], S = in.dims[2], D = in.dims[3], m = in.dims[4];
  const int64_t C = kind == kernels::CompressorKind::hca ? D : 2 * D;
  Inputs x{random_tensor({B, S, C}, DType::f32, in.seed, "kv"), random_tensor({B, S, C}, DType::f32, in.seed, "gate", -6, 6),
           random_tensor({m, C}, DType::f32, in.seed, "bias", -1, 1), kind, m, S / m, D};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; t += m)
      for (int64_t c = 0; c < C; ++c) x.gate.data<float>()[(b * S + t) * C + c] += 60.0f;
  return x;
}

}  // namespace

TITAN_OP_CASES(compressor) {
  const std::vector<std::string> kDims = {"kind", "B", "S", "D", "m"};
  const std::vector<std::vector<int64_t>> shapes = {{1, 1, 16, 8, 4},  {1, 2, 19, 65, 4}, {1, 1, 3, 8, 4},
                                                    {0, 1, 260, 63, 128}, {0, 2, 21, 130, 5}, {0, 1, 7, 1, 1},
                                                    {1, 1, 9, 1, 2}};
  return {
      {"compressor_forward", kDims, shapes,
       [](const OpInput& in) {
         const Inputs x = inputs(in);
         return fast_vs_reference({"entries"}, [&] {
           Tensor out = Tensor::empty({x.kv.size(0), x.entries, x.D}, DType::f32);
           kernels::compressor_forward(out, x.kv, x.gate, x.bias, x.m, x.kind);
           return std::vector<Tensor>{out};
         });
       },
       {DType::f32}},
      {"compressor_backward", kDims, shapes,
       [](const OpInput& in) {
         const Inputs x = inputs(in);
         const Tensor dout = random_tensor({x.kv.size(0), x.entries, x.D}, DType::f32, in.seed, "dout");
         const Tensor dkv0 = random_tensor(x.kv.shape(), DType::f32, in.seed, "dkv");
         const Tensor dbias0 = random_tensor(x.bias.shape(), DType::f32, in.seed, "dbias");
         return fast_vs_reference({"dkv", "dgate", "dbias"}, [&] {
           Tensor dkv = dkv0.clone(), dgate = Tensor::zeros(x.kv.shape(), DType::f32), dbias = dbias0.clone();
           kernels::compressor_backward(dkv, dgate, dbias, dout, x.kv, x.gate, x.bias, x.m, x.kind);
           return std::vector<Tensor>{dkv, dgate, dbias};
         });
       },
       {DType::f32}},
  };
}
