#include "titan/kernels/cast.h"

#include "titan/kernels/cpu/cast.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/cast.h"

namespace titan::kernels {

void cast(Tensor& dst, const Tensor& src) {
  TITAN_CHECK(dst.shape() == src.shape(), "cast: shapes differ: " + dst.shape().str() + " vs " + src.shape().str());
  TITAN_CHECK(dst.is_contiguous() && src.is_contiguous(), "cast: tensors must be contiguous");
  const bool fast = kernel_backend() == KernelBackend::fast;
  const int64_t n = src.numel();
  if (dst.dtype() == DType::bf16 && src.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(cast_f32_to_bf16) : &ref::cast_f32_to_bf16)(dst.data<bf16>(), src.data<float>(), n);
  } else if (dst.dtype() == DType::f32 && src.dtype() == DType::bf16) {
    (fast ? TITAN_CPU_KERNEL(cast_bf16_to_f32) : &ref::cast_bf16_to_f32)(dst.data<float>(), src.data<bf16>(), n);
  } else if (dst.dtype() == DType::f16 && src.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(cast_f32_to_f16) : &ref::cast_f32_to_f16)(dst.data<f16>(), src.data<float>(), n);
  } else if (dst.dtype() == DType::f32 && src.dtype() == DType::f16) {
    (fast ? TITAN_CPU_KERNEL(cast_f16_to_f32) : &ref::cast_f16_to_f32)(dst.data<float>(), src.data<f16>(), n);
  } else if (dst.dtype() == src.dtype()) {
    dst.copy_(src);
  } else {
    TITAN_FAIL("cast: unsupported pair " + std::string(dtype_name(src.dtype())) + " -> " +
               std::string(dtype_name(dst.dtype())), "cast handles f32 to and from bf16 and f16; use Tensor::to for other dtypes");
  }
}

}  // namespace titan::kernels
