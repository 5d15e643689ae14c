// Rows of the op table for kernels/sinkhorn (mHC's doubly stochastic projection). dims =
// {tokens, N, iters}: V4's N = 4 with 20 iterations, token counts around the fast kernel's
// 16-token lanes (1, 15, 17, 1000), and other N (1, 3, 5, 8) and iteration counts (1, 2).
// Logits span [-8, 8] with row 0 of every matrix shifted by +60, which overflows exp unless each
// row's max is subtracted; f32 only (mHC runs in f32).
#include "common/backend_compare.h"
#include "titan/kernels/sinkhorn.h"

using namespace titan;
using namespace titan::test;

namespace {

Tensor logits(const OpInput& in) {
  const int64_t tokens = in.dims[0], n = in.dims[1];
  Tensor l = random_tensor({tokens, n, n}, DType::f32, in.seed, "logits", -8, 8);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t k = 0; k < n; ++k) l.data<float>()[t * n * n + k] += 60.0f;
  return l;
}

}  // namespace

TITAN_OP_CASES(sinkhorn) {
  const std::vector<std::string> kDims = {"tokens", "N", "iters"};
  const std::vector<std::vector<int64_t>> shapes = {{1, 4, 20}, {15, 4, 20}, {17, 4, 20}, {1000, 4, 20},
                                                    {5, 1, 3},  {33, 3, 2},  {40, 5, 1},  {19, 8, 20}};
  return {
      {"sinkhorn_forward", kDims, shapes,
       [](const OpInput& in) {
         const Tensor l = logits(in);
         return fast_vs_reference({"p"}, [&] {
           Tensor p = Tensor::empty(l.shape(), DType::f32);
           kernels::sinkhorn_forward(p, l, int(in.dims[2]), 1e-6);
           return std::vector<Tensor>{p};
         });
       },
       {DType::f32}},
      {"sinkhorn_backward", kDims, shapes,
       [](const OpInput& in) {
         const Tensor l = logits(in);
         const Tensor dp = random_tensor(l.shape(), DType::f32, in.seed, "dp");
         const Tensor dl0 = random_tensor(l.shape(), DType::f32, in.seed, "dl");
         return fast_vs_reference({"dlogits"}, [&] {
           Tensor dl = dl0.clone();
           kernels::sinkhorn_backward(dl, dp, l, int(in.dims[2]), 1e-6);
           return std::vector<Tensor>{dl};
         });
       },
       {DType::f32}},
  };
}
