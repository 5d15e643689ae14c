// Rows of the op table for kernels/gather. dims = {R, M, D}: R rows gathered from / scattered to,
// M indices (random, with repeats), D row length.
#include "common/op_table.h"
#include "titan/kernels/cpu/gather.h"
#include "titan/kernels/ref/gather.h"
#include "titan/kernels/row_buckets.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

namespace {

Tensor random_indices(int64_t m, int64_t r, uint64_t seed) {
  Tensor idx = Tensor::empty({m}, DType::i32);
  Generator g(seed, "idx");
  for (int64_t i = 0; i < m; ++i) idx.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(r)));
  return idx;
}

template <class T>
OpOutputs gather_forward(const OpInput& in) {
  const int64_t r = in.dims[0], m = in.dims[1], d = in.dims[2];
  const Tensor x = random_tensor({r, d}, in.dtype, in.seed, "x");
  const Tensor w = random_tensor({m}, DType::f32, in.seed, "w");
  const Tensor idx = random_indices(m, r, in.seed);
  Tensor fast = Tensor::empty({m, d}, in.dtype), ref = Tensor::empty({m, d}, in.dtype);
  TITAN_CPU_KERNEL(gather_rows_forward<T>)(fast.data<T>(), x.data<T>(), idx.data<int32_t>(), w.data<float>(), m, d);
  ref::gather_rows_forward<T>(ref.data<T>(), x.data<T>(), idx.data<int32_t>(), w.data<float>(), m, d);
  Tensor fast1 = Tensor::empty({m, d}, in.dtype), ref1 = Tensor::empty({m, d}, in.dtype);  // unweighted
  TITAN_CPU_KERNEL(gather_rows_forward<T>)(fast1.data<T>(), x.data<T>(), idx.data<int32_t>(), nullptr, m, d);
  ref::gather_rows_forward<T>(ref1.data<T>(), x.data<T>(), idx.data<int32_t>(), nullptr, m, d);
  return {{"y", fast, ref}, {"y_unweighted", fast1, ref1, 0.0, 0.0}};
}

template <class T>
OpOutputs gather_backward(const OpInput& in) {
  const int64_t r = in.dims[0], m = in.dims[1], d = in.dims[2];
  const Tensor x = random_tensor({r, d}, in.dtype, in.seed, "x");
  const Tensor dy = random_tensor({m, d}, in.dtype, in.seed, "dy");
  const Tensor w = random_tensor({m}, DType::f32, in.seed, "w");
  const Tensor idx = random_indices(m, r, in.seed);
  Tensor dx_fast = random_tensor({r, d}, in.dtype, in.seed, "dx0"), dx_ref = dx_fast.clone();
  Tensor dw_fast = random_tensor({m}, DType::f32, in.seed, "dw0"), dw_ref = dw_fast.clone();
  const kernels::RowBuckets b = kernels::bucket_rows_by_index(idx.data<int32_t>(), m, r);
  TITAN_CPU_KERNEL(gather_rows_backward<T>)(dx_fast.data<T>(), dw_fast.data<float>(), dy.data<T>(), x.data<T>(),
                                            idx.data<int32_t>(), w.data<float>(), b.view(), m, d);
  ref::gather_rows_backward<T>(dx_ref.data<T>(), dw_ref.data<float>(), dy.data<T>(), x.data<T>(), idx.data<int32_t>(),
                               w.data<float>(), r, m, d);
  return {{"dx", dx_fast, dx_ref}, {"dw", dw_fast, dw_ref}};
}

template <class T>
OpOutputs scatter_forward(const OpInput& in) {
  const int64_t r = in.dims[0], m = in.dims[1], d = in.dims[2];
  const Tensor x = random_tensor({m, d}, in.dtype, in.seed, "x");
  const Tensor w = random_tensor({m}, DType::f32, in.seed, "w");
  const Tensor idx = random_indices(m, r, in.seed);
  Tensor fast = random_tensor({r, d}, in.dtype, in.seed, "y0"), ref = fast.clone();
  const kernels::RowBuckets b = kernels::bucket_rows_by_index(idx.data<int32_t>(), m, r);
  TITAN_CPU_KERNEL(scatter_add_rows_forward<T>)(fast.data<T>(), x.data<T>(), w.data<float>(), b.view(), d);
  ref::scatter_add_rows_forward<T>(ref.data<T>(), x.data<T>(), idx.data<int32_t>(), w.data<float>(), r, m, d);
  return {{"y", fast, ref}};
}

template <class T>
OpOutputs scatter_backward(const OpInput& in) {
  const int64_t r = in.dims[0], m = in.dims[1], d = in.dims[2];
  const Tensor x = random_tensor({m, d}, in.dtype, in.seed, "x");
  const Tensor dy = random_tensor({r, d}, in.dtype, in.seed, "dy");
  const Tensor w = random_tensor({m}, DType::f32, in.seed, "w");
  const Tensor idx = random_indices(m, r, in.seed);
  Tensor dx_fast = random_tensor({m, d}, in.dtype, in.seed, "dx0"), dx_ref = dx_fast.clone();
  Tensor dw_fast = random_tensor({m}, DType::f32, in.seed, "dw0"), dw_ref = dw_fast.clone();
  TITAN_CPU_KERNEL(scatter_add_rows_backward<T>)(dx_fast.data<T>(), dw_fast.data<float>(), dy.data<T>(), x.data<T>(),
                                                 idx.data<int32_t>(), w.data<float>(), m, d);
  ref::scatter_add_rows_backward<T>(dx_ref.data<T>(), dw_ref.data<float>(), dy.data<T>(), x.data<T>(),
                                    idx.data<int32_t>(), w.data<float>(), m, d);
  return {{"dx", dx_fast, dx_ref}, {"dw", dw_fast, dw_ref}};
}

const std::vector<std::vector<int64_t>> kShapes = {{1, 1, 1},   {3, 17, 5},   {17, 3, 33},  {64, 512, 7},
                                                   {100, 800, 96}, {7, 1000, 300}, {1000, 64, 129}};

#define TITAN_BY_DTYPE(fn) [](const OpInput& in) { return in.dtype == DType::f32 ? fn<float>(in) : fn<bf16>(in); }

const std::vector<std::string> kDims = {"R", "M", "D"};

}  // namespace

TITAN_OP_CASES(gather) {
  return {
      {"gather_rows_forward", kDims, kShapes, TITAN_BY_DTYPE(gather_forward)},
      {"gather_rows_backward", kDims, kShapes, TITAN_BY_DTYPE(gather_backward)},
      {"scatter_add_rows_forward", kDims, kShapes, TITAN_BY_DTYPE(scatter_forward)},
      {"scatter_add_rows_backward", kDims, kShapes, TITAN_BY_DTYPE(scatter_backward)},
  };
}
