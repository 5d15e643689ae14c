// Rows of the op table for the fused AdamW step. dims = {n}.
#include "common/op_table.h"
#include "titan/kernels/cpu/adamw.h"
#include "titan/kernels/ref/adamw.h"

using namespace titan;
using namespace titan::test;

TITAN_OP_CASES(adamw) {
  return {{"adamw_step", {"n"}, {{1}, {17}, {1000}, {40009}},
           [](const OpInput& in) {
             const int64_t n = in.dims[0];
             kernels::AdamWParams a;
             a.lr = 3e-3f, a.weight_decay = 0.1f, a.grad_scale = 0.7f;
             a.bias_correction1 = 1 - 0.9f * 0.9f * 0.9f, a.bias_correction2 = 1 - 0.95f * 0.95f * 0.95f;
             Tensor g = random_tensor({n}, DType::f32, in.seed, "g");
             Tensor p0 = random_tensor({n}, DType::f32, in.seed, "p");
             Tensor m0 = random_tensor({n}, DType::f32, in.seed, "m", -0.1, 0.1);
             Tensor v0 = random_tensor({n}, DType::f32, in.seed, "v", 0, 0.01);
             Tensor pf = p0.clone(), mf = m0.clone(), vf = v0.clone(), bf = Tensor::empty({n}, DType::bf16);
             Tensor pr = p0.clone(), mr = m0.clone(), vr = v0.clone(), br = Tensor::empty({n}, DType::bf16);
             TITAN_CPU_KERNEL(adamw_step)(pf.data<float>(), mf.data<float>(), vf.data<float>(), bf.data<bf16>(),
                                          g.data<float>(), n, a);
             kernels::ref::adamw_step(pr.data<float>(), mr.data<float>(), vr.data<float>(), br.data<bf16>(),
                                      g.data<float>(), n, a);
             return OpOutputs{{"p", pf, pr, 1e-6, 1e-5}, {"m", mf, mr, 1e-7, 1e-6}, {"v", vf, vr, 1e-9, 1e-6},
                              {"p_bf16", bf, br, 1e-2, 1e-2}};
           },
           {DType::f32}}};
}
