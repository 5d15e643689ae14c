#include "titan/kernels/topk.h"

#include <string>

#include "titan/kernels/cpu/topk.h"
#include "titan/kernels/ref/topk.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

void topk(Tensor& values, Tensor& indices, const Tensor& x, int64_t k) {
  detail::check_activation(x, "topk", "x");
  const int64_t n = detail::last_dim(x, "topk");
  TITAN_CHECK(k >= 1 && k <= n, "topk: k = " + std::to_string(k) + " is outside [1, n = " + std::to_string(n) + "]",
              "for fewer candidates than k, pad the row with -inf (those entries rank last)");
  TITAN_CHECK(n <= INT32_MAX, "topk: rows of " + std::to_string(n) + " entries exceed i32 indices",
              "split the row and merge the partial top-k");
  Shape out_shape = x.shape();
  out_shape[out_shape.size() - 1] = k;
  TITAN_CHECK(values.shape() == out_shape && values.dtype() == x.dtype() && values.is_contiguous(),
              "topk: values must be " + out_shape.str() + " in " + std::string(dtype_name(x.dtype())) + ", got " +
                  values.str(),
              "allocate values like x with the last dim set to k");
  TITAN_CHECK(indices.shape() == out_shape && indices.dtype() == DType::i32 && indices.is_contiguous(),
              "topk: indices must be i32 " + out_shape.str() + ", got " + indices.str(), "allocate indices as i32");
  const int64_t rows = x.numel() / n;
  detail::dispatch_activation(x.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(topk<T>) : &ref::topk<T>)(values.data<T>(), indices.data<int32_t>(),
                                                                     x.data<T>(), rows, n, k);
  });
}

}  // namespace titan::kernels
