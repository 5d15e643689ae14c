// The Tensor-level attention API: argument checks, the default scale, backend switch, and the
// fast backward's run-to-run determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/kernel_check.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/dispatch.h"

using namespace titan;
using namespace titan::test;

namespace {

struct Problem {
  Tensor q, k, v, o, lse;
  Problem(int64_t B, int64_t S, int64_t H, int64_t Hkv, int64_t Dqk, int64_t Dv, DType dt)
      : q(random_tensor({B, S, H, Dqk}, dt, 3, "q")),
        k(random_tensor({B, S, Hkv, Dqk}, dt, 3, "k")),
        v(random_tensor({B, S, Hkv, Dv}, dt, 3, "v")),
        o(Tensor::empty({B, S, H, Dv}, dt)),
        lse(Tensor::empty({B, H, S}, DType::f32)) {}
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST(AttentionApi, RejectsBadArguments) {
  Problem p(1, 8, 3, 2, 16, 16, DType::f32);  // 3 heads do not split into 2 kv heads
  EXPECT_THROW(kernels::attention_forward(p.o, p.lse, p.q, p.k, p.v), Error);
  Problem r(1, 8, 4, 2, 16, 16, DType::f32);
  Tensor bad_lse = Tensor::empty({1, 8, 4}, DType::f32);  // [B, S, H] instead of [B, H, S]
  EXPECT_THROW(kernels::attention_forward(r.o, bad_lse, r.q, r.k, r.v), Error);
  Tensor bf16_k = r.k.to(DType::bf16);
  EXPECT_THROW(kernels::attention_forward(r.o, r.lse, r.q, bf16_k, r.v), Error);
  EXPECT_THROW(kernels::attention_forward(r.o, r.lse, r.q, r.k, r.v, NAN), Error);
}

TEST(AttentionApi, DefaultScaleIsInverseSqrtHeadDim) {
  Problem p(1, 9, 2, 1, 24, 8, DType::f32);
  kernels::attention_forward(p.o, p.lse, p.q, p.k, p.v);
  Tensor o2 = p.o.clone(), lse2 = p.lse.clone();
  kernels::attention_forward(o2, lse2, p.q, p.k, p.v, 1 / std::sqrt(24.0));
  EXPECT_TRUE(bitwise_equal(p.o, o2));
  EXPECT_TRUE(bitwise_equal(p.lse, lse2));
}

TEST(AttentionApi, ReferenceBackendAgreesWithFast) {
  Problem p(2, 70, 4, 2, 40, 24, DType::f32);
  kernels::attention_forward(p.o, p.lse, p.q, p.k, p.v);
  kernels::set_kernel_backend(kernels::KernelBackend::reference);
  Tensor o_ref = p.o.clone(), lse_ref = p.lse.clone();
  kernels::attention_forward(o_ref, lse_ref, p.q, p.k, p.v);
  kernels::set_kernel_backend(kernels::KernelBackend::fast);
  const ErrorStats eo = compare(to_doubles(p.o), to_doubles(o_ref), 1e-5, 1e-4);
  const ErrorStats el = compare(to_doubles(p.lse), to_doubles(lse_ref), 1e-5, 1e-4);
  EXPECT_LE(eo.max_scaled, 1.0) << "o max_abs " << eo.max_abs;
  EXPECT_LE(el.max_scaled, 1.0) << "lse max_abs " << el.max_abs;
}

// Same inputs, same bits: no atomics or schedule-dependent sums in the backward.
TEST(AttentionApi, FastBackwardIsDeterministic) {
  Problem p(1, 200, 4, 1, 32, 32, DType::bf16);
  kernels::attention_forward(p.o, p.lse, p.q, p.k, p.v);
  Tensor dout = random_tensor(p.o.shape(), DType::bf16, 3, "dout");
  Tensor first[3], second[3];
  for (Tensor* grads : {first, second}) {
    grads[0] = Tensor::zeros(p.q.shape(), DType::bf16);
    grads[1] = Tensor::zeros(p.k.shape(), DType::bf16);
    grads[2] = Tensor::zeros(p.v.shape(), DType::bf16);
    kernels::attention_backward(grads[0], grads[1], grads[2], p.lse, dout, p.q, p.k, p.v, p.o);
  }
  for (int t = 0; t < 3; ++t) EXPECT_TRUE(bitwise_equal(first[t], second[t])) << "gradient " << t;
}
