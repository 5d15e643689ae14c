// Rows of the op table for kernels/softmax. dims = {N, D}. Logits span [-20, 20] and row 0 is
// shifted by +1000, which overflows exp unless the row max is subtracted.
#include <limits>

#include "common/backend_compare.h"
#include "titan/kernels/softmax.h"

using namespace titan;
using namespace titan::test;

TITAN_OP_CASES(softmax) {
  const std::vector<std::string> kDims = {"N", "D"};
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {1, 7}, {3, 33}, {5, 129}, {2, 1000}, {3, 4097}, {300, 64}};
  // Outputs of 16 MiB and more are written with streaming stores (kernels/cpu/chunks.h); 2100 x
  // 4097 crosses that in bf16 and f32, with rows that start unaligned.
  std::vector<std::vector<int64_t>> forward_shapes = shapes;
  forward_shapes.push_back({2100, 4097});
  return {
      {"softmax_forward", kDims, forward_shapes,
       [](const OpInput& in) {
         Tensor x32 = random_tensor({in.dims[0], in.dims[1]}, DType::f32, in.seed, "x", -20, 20);
         for (int64_t j = 0; j < in.dims[1]; ++j) x32.data<float>()[j] += 1000.0f;
         const Tensor x = x32.to(in.dtype);
         return fast_vs_reference({"y"}, [&] {
           Tensor y = Tensor::empty(x.shape(), in.dtype);
           kernels::softmax_forward(y, x);
           return std::vector<Tensor>{y};
         });
       }},
      // Masked logits: about a third of each row (never its first entry) is -inf, as a masked
      // score is. exp(-inf) is exactly 0 on every path (kernels/cpu/isa.h fast_exp, avx512.h
      // exp2_16), so y is exactly 0 there and backward leaves dx unchanged; a kernel that turns
      // -inf into NaN, or a max pass that lets -inf through, fails the exact non-finite comparison.
      {"softmax_masked", kDims, shapes,
       [](const OpInput& in) {
         Tensor x32 = random_tensor({in.dims[0], in.dims[1]}, DType::f32, in.seed, "x", -20, 20);
         Generator g(in.seed, "mask");
         constexpr float kMasked = -std::numeric_limits<float>::infinity();
         for (int64_t i = 0; i < x32.numel(); ++i)
           if (i % in.dims[1] != 0 && g.next_below(3) == 0) x32.data<float>()[i] = kMasked;
         const Tensor x = x32.to(in.dtype);
         const Tensor dy = random_tensor(x.shape(), in.dtype, in.seed, "dy");
         const Tensor dx0 = random_tensor(x.shape(), in.dtype, in.seed, "dx");
         return fast_vs_reference({"y", "dx"}, [&] {
           Tensor y = Tensor::empty(x.shape(), in.dtype), dx = dx0.clone();
           kernels::softmax_forward(y, x);
           kernels::softmax_backward(dx, dy, y);
           return std::vector<Tensor>{y, dx};
         });
       }},
      {"softmax_backward", kDims, shapes,
       [](const OpInput& in) {
         // y is a real softmax output (rows sum to 1), as backward assumes.
         const Tensor x = random_tensor({in.dims[0], in.dims[1]}, in.dtype, in.seed, "x", -4, 4);
         Tensor y = Tensor::empty(x.shape(), in.dtype);
         kernels::softmax_forward(y, x);
         const Tensor dy = random_tensor(x.shape(), in.dtype, in.seed, "dy");
         const Tensor dx0 = random_tensor(x.shape(), in.dtype, in.seed, "dx");
         return fast_vs_reference({"dx"}, [&] {
           Tensor dx = dx0.clone();
           kernels::softmax_backward(dx, dy, y);
           return std::vector<Tensor>{dx};
         });
       }},
  };
}
