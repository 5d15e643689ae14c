#include "titan/kernels/sinkhorn.h"

#include "titan/core/error.h"
#include "titan/kernels/cpu/sinkhorn.h"
#include "titan/kernels/ref/sinkhorn.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

using detail::use_fast;

namespace {

// The matrix size N of logits [..., N, N] (f32, contiguous), with the checks every entry shares.
int64_t matrix_size(const Tensor& logits, int iters, const char* op) {
  TITAN_CHECK(logits.dtype() == DType::f32 && logits.is_contiguous() && logits.dim() >= 2 &&
                  logits.size(-1) == logits.size(-2),
              std::string(op) + ": logits must be f32 contiguous [..., N, N], got " + logits.str());
  TITAN_CHECK(iters >= 1, std::string(op) + ": iters must be at least 1, got " + std::to_string(iters));
  return logits.size(-1);
}

void check_same(const Tensor& t, const Tensor& logits, const char* op, const char* name) {
  TITAN_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == logits.shape(),
              std::string(op) + ": " + name + " must be f32 contiguous " + logits.shape().str() + ", got " + t.str());
}

}  // namespace

void sinkhorn_forward(Tensor& p, const Tensor& logits, int iters, double eps) {
  const int64_t n = matrix_size(logits, iters, "sinkhorn_forward");
  check_same(p, logits, "sinkhorn_forward", "p");
  const int64_t tokens = n == 0 ? 0 : logits.numel() / (n * n);
  if (tokens == 0) return;
  (use_fast() ? TITAN_CPU_KERNEL(sinkhorn_forward) : &ref::sinkhorn_forward<float>)(p.data<float>(), logits.data<float>(),
                                                                                    tokens, n, iters, eps);
}

void sinkhorn_backward(Tensor& dlogits, const Tensor& dp, const Tensor& logits, int iters, double eps) {
  const int64_t n = matrix_size(logits, iters, "sinkhorn_backward");
  check_same(dp, logits, "sinkhorn_backward", "dp");
  check_same(dlogits, logits, "sinkhorn_backward", "dlogits");
  const int64_t tokens = n == 0 ? 0 : logits.numel() / (n * n);
  if (tokens == 0) return;
  (use_fast() ? TITAN_CPU_KERNEL(sinkhorn_backward) : &ref::sinkhorn_backward<float>)(
      dlogits.data<float>(), dp.data<float>(), logits.data<float>(), tokens, n, iters, eps);
}

}  // namespace titan::kernels
