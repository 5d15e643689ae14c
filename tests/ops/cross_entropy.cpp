// Rows of the op table for kernels/cross_entropy. dims = {N, V}; logits in [-8, 8), every 5th
// target is ignore_index; backward uses per-token dloss and a scale.
#include "common/op_table.h"
#include "titan/kernels/cpu/cross_entropy.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/ref/cross_entropy.h"

using namespace titan;
using namespace titan::test;
using kernels::kIgnoreIndex;

namespace {

Tensor make_targets(int64_t n, int64_t v, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::i32);
  Generator g(seed, "targets");
  for (int64_t r = 0; r < n; ++r) t.data<int32_t>()[r] = r % 5 == 4 ? kIgnoreIndex : int32_t(g.next_below(uint64_t(v)));
  return t;
}

template <class T>
OpOutputs forward(const OpInput& in) {
  const int64_t n = in.dims[0], v = in.dims[1];
  const Tensor logits = random_tensor({n, v}, in.dtype, in.seed, "logits", -8, 8);
  const Tensor targets = make_targets(n, v, in.seed);
  Tensor loss_fast = Tensor::empty({n}, DType::f32), lse_fast = Tensor::empty({n}, DType::f32);
  Tensor loss_ref = Tensor::empty({n}, DType::f32), lse_ref = Tensor::empty({n}, DType::f32);
  TITAN_CPU_KERNEL(cross_entropy_forward<T>)(loss_fast.data<float>(), lse_fast.data<float>(), logits.data<T>(),
                                             targets.data<int32_t>(), n, v, kIgnoreIndex);
  kernels::ref::cross_entropy_forward<T>(loss_ref.data<float>(), lse_ref.data<float>(), logits.data<T>(),
                                         targets.data<int32_t>(), n, v, kIgnoreIndex);
  // f32 sums over V terms in different orders: relative error grows like sqrt(V) ulp.
  return {{"loss", loss_fast, loss_ref, 1e-4, 1e-4}, {"lse", lse_fast, lse_ref, 1e-4, 1e-5}};
}

template <class T>
OpOutputs backward(const OpInput& in) {
  const int64_t n = in.dims[0], v = in.dims[1];
  const Tensor logits = random_tensor({n, v}, in.dtype, in.seed, "logits", -8, 8);
  const Tensor targets = make_targets(n, v, in.seed);
  Tensor loss = Tensor::empty({n}, DType::f32), lse = Tensor::empty({n}, DType::f32);
  kernels::ref::cross_entropy_forward<T>(loss.data<float>(), lse.data<float>(), logits.data<T>(),
                                         targets.data<int32_t>(), n, v, kIgnoreIndex);
  const Tensor dloss = random_tensor({n}, DType::f32, in.seed, "dloss");
  Tensor fast = Tensor::empty({n, v}, in.dtype), ref = Tensor::empty({n, v}, in.dtype);
  Tensor in_place = logits.clone();
  TITAN_CPU_KERNEL(cross_entropy_backward<T>)(fast.data<T>(), logits.data<T>(), targets.data<int32_t>(),
                                              lse.data<float>(), dloss.data<float>(), 0.25f, n, v, kIgnoreIndex);
  TITAN_CPU_KERNEL(cross_entropy_backward<T>)(in_place.data<T>(), in_place.data<T>(), targets.data<int32_t>(),
                                              lse.data<float>(), dloss.data<float>(), 0.25f, n, v, kIgnoreIndex);
  kernels::ref::cross_entropy_backward<T>(ref.data<T>(), logits.data<T>(), targets.data<int32_t>(), lse.data<float>(),
                                          dloss.data<float>(), 0.25f, n, v, kIgnoreIndex);
  return {{"dlogits", fast, ref, 1e-6, -1}, {"dlogits_in_place", in_place, ref, 1e-6, -1}};
}

// 4113 and 8199: a last chunk of 17 entries (one full 16-lane step and one masked) and of 7.
const std::vector<std::vector<int64_t>> kShapes = {{1, 1},     {3, 7},       {5, 4096},  {4, 4097}, {2, 4113},
                                                   {3, 8199},  {7, 10000},   {2, 129280}, {64, 1000}};

const std::vector<std::string> kDims = {"N", "V"};

}  // namespace

TITAN_OP_CASES(cross_entropy) {
  return {
      {"cross_entropy_forward", kDims, kShapes,
       [](const OpInput& in) { return in.dtype == DType::f32 ? forward<float>(in) : forward<bf16>(in); }},
      {"cross_entropy_backward", kDims, kShapes,
       [](const OpInput& in) { return in.dtype == DType::f32 ? backward<float>(in) : backward<bf16>(in); }},
  };
}
