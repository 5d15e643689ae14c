// Rows of the op table for kernels/embedding. dims = {V, N, D}: vocabulary, tokens (random ids,
// with repeats), row length.
#include "common/op_table.h"
#include "titan/kernels/cpu/embedding.h"
#include "titan/kernels/ref/embedding.h"
#include "titan/kernels/row_buckets.h"

using namespace titan;
using namespace titan::test;
namespace ref = titan::kernels::ref;

namespace {

Tensor random_ids(int64_t m, int64_t r, uint64_t seed) {
  Tensor ids = Tensor::empty({m}, DType::i32);
  Generator g(seed, "ids");
  for (int64_t i = 0; i < m; ++i) ids.data<int32_t>()[i] = int32_t(g.next_below(uint64_t(r)));
  return ids;
}

template <class T>
OpOutputs embedding_forward(const OpInput& in) {
  const int64_t v = in.dims[0], n = in.dims[1], d = in.dims[2];
  const Tensor table = random_tensor({v, d}, DType::f32, in.seed, "table");
  const Tensor ids = random_ids(n, v, in.seed);
  Tensor fast = Tensor::empty({n, d}, in.dtype), ref = Tensor::empty({n, d}, in.dtype);
  TITAN_CPU_KERNEL(embedding_forward<T>)(fast.data<T>(), table.data<float>(), ids.data<int32_t>(), n, d);
  ref::embedding_forward<T>(ref.data<T>(), table.data<float>(), ids.data<int32_t>(), n, d);
  return {{"y", fast, ref, 0.0, 0.0}};  // a copy (and one rounding): exact
}

template <class T>
OpOutputs embedding_backward(const OpInput& in) {
  const int64_t v = in.dims[0], n = in.dims[1], d = in.dims[2];
  const Tensor dy = random_tensor({n, d}, in.dtype, in.seed, "dy");
  const Tensor ids = random_ids(n, v, in.seed);
  Tensor fast = random_tensor({v, d}, DType::f32, in.seed, "dtable0"), ref = fast.clone();
  const kernels::RowBuckets b = kernels::bucket_rows_by_index(ids.data<int32_t>(), n, v);
  TITAN_CPU_KERNEL(embedding_backward<T>)(fast.data<float>(), dy.data<T>(), b.view(), d);
  ref::embedding_backward<T>(ref.data<float>(), dy.data<T>(), ids.data<int32_t>(), n, d);
  // Same additions in the same order per element, but FMA contraction may differ between builds.
  return {{"dtable", fast, ref, 1e-6, 1e-6}};
}

const std::vector<std::vector<int64_t>> kShapes = {{1, 1, 1},     {3, 17, 5},      {17, 3, 33},    {64, 512, 7},
                                                   {100, 800, 96}, {7, 1000, 300}, {1000, 64, 129}};

#define TITAN_BY_DTYPE(fn) [](const OpInput& in) { return in.dtype == DType::f32 ? fn<float>(in) : fn<bf16>(in); }

const std::vector<std::string> kDims = {"V", "N", "D"};

}  // namespace

TITAN_OP_CASES(embedding) {
  return {
      {"embedding_forward", kDims, kShapes, TITAN_BY_DTYPE(embedding_forward)},
      {"embedding_backward", kDims, kShapes, TITAN_BY_DTYPE(embedding_backward)},
  };
}
