// Rows of the op table for kernels/cast. dims = {n}.
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
  };
}
