// Rows of the op table for kernels/topk. dims = {rows, n, k, mode}: mode 0 continuous values,
// 1 heavy ties (8 distinct values), 2 specials (most entries -inf, some NaN, +-0, +inf).
// Indices and values must match the reference exactly.
#include <cmath>
#include <limits>

#include "common/op_table.h"
#include "titan/kernels/cpu/topk.h"
#include "titan/kernels/ref/topk.h"

using namespace titan;
using namespace titan::test;

namespace {

Tensor make_input(const OpInput& in) {
  const int64_t rows = in.dims[0], n = in.dims[1], mode = in.dims[3];
  Tensor x = random_tensor({rows, n}, DType::f32, in.seed, "x", -4, 4);
  float* p = x.data<float>();
  Generator g(in.seed, "specials");
  for (int64_t i = 0; i < rows * n; ++i) {
    if (mode == 1) p[i] = std::floor(p[i]);
    if (mode == 2) {
      const uint64_t r = g.next_below(16);
      if (r < 10) p[i] = -std::numeric_limits<float>::infinity();
      if (r == 10) p[i] = std::numeric_limits<float>::quiet_NaN();
      if (r == 11) p[i] = -0.0f;
      if (r == 12) p[i] = 0.0f;
      if (r == 13) p[i] = std::numeric_limits<float>::infinity();
    }
  }
  return in.dtype == DType::f32 ? x : x.to(in.dtype);
}

template <class T>
OpOutputs run(const OpInput& in) {
  const int64_t rows = in.dims[0], n = in.dims[1], k = in.dims[2];
  const Tensor x = make_input(in);
  Tensor v_fast = Tensor::empty({rows, k}, in.dtype), v_ref = Tensor::empty({rows, k}, in.dtype);
  Tensor i_fast = Tensor::empty({rows, k}, DType::i32), i_ref = Tensor::empty({rows, k}, DType::i32);
  TITAN_CPU_KERNEL(topk<T>)(v_fast.data<T>(), i_fast.data<int32_t>(), x.data<T>(), rows, n, k);
  kernels::ref::topk<T>(v_ref.data<T>(), i_ref.data<int32_t>(), x.data<T>(), rows, n, k);
  const bool nan_inputs = in.dims[3] == 2;  // NaN ranks above +inf (ref/topk.h): selected NaNs come out as NaN
  return {{"values", v_fast, v_ref, 0.0, 0.0, nan_inputs}, {"indices", i_fast, i_ref, 0.0, 0.0}};
}

}  // namespace

TITAN_OP_CASES(topk) {
  std::vector<std::vector<int64_t>> shapes;
  for (int64_t mode : {0, 1, 2}) {
    for (auto s : std::vector<std::vector<int64_t>>{{1, 1, 1},     {3, 10, 10},     {5, 100, 7},      {8, 256, 8},
                                                    {4, 1000, 32}, {4, 1000, 33},   {3, 4097, 1000},  {2, 5000, 2048},
                                                    {1, 131072, 2048}, {2, 70000, 1}}) {
      s.push_back(mode);
      shapes.push_back(s);
    }
  }
  return {{"topk", {"rows", "n", "k", "mode"}, shapes,
           [](const OpInput& in) { return in.dtype == DType::f32 ? run<float>(in) : run<bf16>(in); }}};
}
