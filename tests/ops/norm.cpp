// Rows of the op table for kernels/norm. dims = {N, D}; N = 130 spans three 64-row blocks of the
// fast weight-gradient reduction. Gradients start non-zero (backward accumulates).
#include "common/backend_compare.h"
#include "titan/kernels/norm.h"

using namespace titan;
using namespace titan::test;

namespace {
const std::vector<std::string> kDims = {"N", "D"};
const std::vector<std::vector<int64_t>> kShapes = {{1, 1}, {1, 7}, {3, 33}, {5, 129}, {2, 1000}, {3, 4097}, {130, 64}};
// Forward outputs of 16 MiB and more are written with streaming stores (kernels/cpu/chunks.h);
// 2100 x 4097 crosses that in bf16 and f32, with rows that start unaligned.
const std::vector<std::vector<int64_t>> kForwardShapes = {{1, 1},    {1, 7},    {3, 33},   {5, 129},
                                                          {2, 1000}, {3, 4097}, {130, 64}, {2100, 4097}};
constexpr double kEps = 1e-5;

struct NormInputs {
  Tensor x, w, b, dy, dx0, dw0, db0;
};

NormInputs make_inputs(const OpInput& in) {
  const int64_t N = in.dims[0], D = in.dims[1];
  // x has a non-zero mean (offset 0.5) so LayerNorm's centering matters.
  return {random_tensor({N, D}, in.dtype, in.seed, "x", -1.5, 2.5),
          random_tensor({D}, DType::f32, in.seed, "w", 0.5, 1.5),
          random_tensor({D}, DType::f32, in.seed, "b", -0.5, 0.5),
          random_tensor({N, D}, in.dtype, in.seed, "dy"),
          random_tensor({N, D}, in.dtype, in.seed, "dx"),
          random_tensor({D}, DType::f32, in.seed, "dw"),
          random_tensor({D}, DType::f32, in.seed, "db")};
}
}  // namespace

TITAN_OP_CASES(norm) {
  return {
      {"rmsnorm_forward", kDims, kForwardShapes,
       [](const OpInput& in) {
         const NormInputs v = make_inputs(in);
         return fast_vs_reference({"y", "rstd"}, [&] {
           Tensor y = Tensor::empty(v.x.shape(), in.dtype), rstd = Tensor::empty({in.dims[0]}, DType::f32);
           kernels::rmsnorm_forward(y, rstd, v.x, v.w, kEps);
           return std::vector<Tensor>{y, rstd};
         });
       }},
      {"rmsnorm_backward", kDims, kShapes,
       [](const OpInput& in) {
         const NormInputs v = make_inputs(in);
         Tensor y = Tensor::empty(v.x.shape(), in.dtype), rstd = Tensor::empty({in.dims[0]}, DType::f32);
         kernels::rmsnorm_forward(y, rstd, v.x, v.w, kEps);
         return fast_vs_reference({"dx", "dw", "dx_frozen_w"}, [&] {
           Tensor dx = v.dx0.clone(), dw = v.dw0.clone(), dx_frozen = v.dx0.clone(), no_dw;
           kernels::rmsnorm_backward(dx, dw, rstd, v.dy, v.x, v.w);
           kernels::rmsnorm_backward(dx_frozen, no_dw, rstd, v.dy, v.x, v.w);
           return std::vector<Tensor>{dx, dw, dx_frozen};
         });
       }},
      {"layernorm_forward", kDims, kForwardShapes,
       [](const OpInput& in) {
         const NormInputs v = make_inputs(in);
         return fast_vs_reference({"y", "mean", "rstd"}, [&] {
           Tensor y = Tensor::empty(v.x.shape(), in.dtype), mean = Tensor::empty({in.dims[0]}, DType::f32),
                  rstd = Tensor::empty({in.dims[0]}, DType::f32);
           kernels::layernorm_forward(y, mean, rstd, v.x, v.w, v.b, kEps);
           return std::vector<Tensor>{y, mean, rstd};
         });
       }},
      {"layernorm_backward", kDims, kShapes,
       [](const OpInput& in) {
         const NormInputs v = make_inputs(in);
         Tensor y = Tensor::empty(v.x.shape(), in.dtype), mean = Tensor::empty({in.dims[0]}, DType::f32),
                rstd = Tensor::empty({in.dims[0]}, DType::f32);
         kernels::layernorm_forward(y, mean, rstd, v.x, v.w, v.b, kEps);
         return fast_vs_reference({"dx", "dw", "db", "dx_frozen"}, [&] {
           Tensor dx = v.dx0.clone(), dw = v.dw0.clone(), db = v.db0.clone(), dx_frozen = v.dx0.clone(), none;
           kernels::layernorm_backward(dx, dw, db, mean, rstd, v.dy, v.x, v.w);
           kernels::layernorm_backward(dx_frozen, none, none, mean, rstd, v.dy, v.x, v.w);
           return std::vector<Tensor>{dx, dw, db, dx_frozen};
         });
       }},
  };
}
