#include "titan/kernels/topk.h"

#include <string>

#include "titan/kernels/cpu/topk.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/topk.h"

namespace titan::kernels {

void topk(Tensor& values, Tensor& indices, const Tensor& x, int64_t k) {
  TITAN_CHECK(x.dim() >= 1 && x.is_contiguous() && (x.dtype() == DType::f32 || x.dtype() == DType::bf16),
              "topk: x must be contiguous f32/bf16 [..., n], got " + x.str(), "call .contiguous() or cast first");
  const int64_t n = x.size(-1);
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
  const bool fast = kernel_backend() == KernelBackend::fast;
  if (x.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(topk<float>) : &ref::topk<float>)(values.data<float>(), indices.data<int32_t>(),
                                                                x.data<float>(), rows, n, k);
  } else {
    (fast ? TITAN_CPU_KERNEL(topk<bf16>) : &ref::topk<bf16>)(values.data<bf16>(), indices.data<int32_t>(),
                                                              x.data<bf16>(), rows, n, k);
  }
}

}  // namespace titan::kernels
