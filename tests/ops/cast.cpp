// Rows of the op table for kernels/cast. dims = {n}.
#include <algorithm>
#include <limits>

#include "common/op_table.h"
#include "titan/kernels/cpu/cast.h"
#include "titan/kernels/ref/cast.h"

using namespace titan;
using namespace titan::test;

TITAN_OP_CASES(cast) {
  const std::vector<std::vector<int64_t>> shapes = {{1}, {31}, {33}, {1000}, {70001}};
  return {
      {"cast_f32_to_bf16", {"n"}, shapes,
       [](const OpInput& in) {
         Tensor x = random_tensor({in.dims[0]}, DType::f32, in.seed, "x", -300, 300);
         x.data<float>()[0] = 1.0f + 1.0f / 256;  // a rounding tie
         Tensor fast = Tensor::empty(x.shape(), DType::bf16), ref = Tensor::empty(x.shape(), DType::bf16);
         TITAN_CPU_KERNEL(cast_f32_to_bf16)(fast.data<bf16>(), x.data<float>(), x.numel());
         kernels::ref::cast_f32_to_bf16(ref.data<bf16>(), x.data<float>(), x.numel());
         return OpOutputs{{"y", fast, ref, 0.0, 0.0}};  // must be bit-exact
       },
       {DType::f32}},
      {"cast_bf16_to_f32", {"n"}, shapes,
       [](const OpInput& in) {
         Tensor x = random_tensor({in.dims[0]}, DType::bf16, in.seed, "x", -300, 300);
         Tensor fast = Tensor::empty(x.shape(), DType::f32), ref = Tensor::empty(x.shape(), DType::f32);
         TITAN_CPU_KERNEL(cast_bf16_to_f32)(fast.data<float>(), x.data<bf16>(), x.numel());
         kernels::ref::cast_bf16_to_f32(ref.data<float>(), x.data<bf16>(), x.numel());
         return OpOutputs{{"y", fast, ref, 0.0, 0.0}};
       },
       {DType::bf16}},
      {"cast_f32_to_f16", {"n"}, shapes,
       [](const OpInput& in) {
         Tensor x = random_tensor({in.dims[0]}, DType::f32, in.seed, "x", -300, 300);
         float* v = x.data<float>();
         // A rounding tie, an overflow to infinity, f16 subnormals, an underflow to zero, NaN, -inf:
         // the specials the loss scaler relies on.
         const float specials[] = {1.0f + 1.0f / 2048, 70000.0f, 65520.0f, 3e-6f, -1e-7f, 1e-9f,
                                   std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()};
         for (int64_t i = 0; i < std::min<int64_t>(x.numel(), 8); ++i) v[i] = specials[i];
         Tensor fast = Tensor::empty(x.shape(), DType::f16), ref = Tensor::empty(x.shape(), DType::f16);
         TITAN_CPU_KERNEL(cast_f32_to_f16)(fast.data<f16>(), x.data<float>(), x.numel());
         kernels::ref::cast_f32_to_f16(ref.data<f16>(), x.data<float>(), x.numel());
         OpOutputs out{{"y", fast, ref, 0.0, 0.0}};  // exact, NaN for NaN
         out[0].reference_nan = true;
         return out;
       },
       {DType::f32}},
      {"cast_f16_to_f32", {"n"}, shapes,
       [](const OpInput& in) {
         Tensor x = random_tensor({in.dims[0]}, DType::f16, in.seed, "x", -300, 300);
         x.data<f16>()[0] = f16{0x0001};  // the smallest subnormal
         Tensor fast = Tensor::empty(x.shape(), DType::f32), ref = Tensor::empty(x.shape(), DType::f32);
         TITAN_CPU_KERNEL(cast_f16_to_f32)(fast.data<float>(), x.data<f16>(), x.numel());
         kernels::ref::cast_f16_to_f32(ref.data<float>(), x.data<f16>(), x.numel());
         return OpOutputs{{"y", fast, ref, 0.0, 0.0}};
       },
       {DType::f16}},
  };
}
