#include "titan/kernels/cross_entropy.h"

#include <string>

#include "titan/kernels/cpu/cross_entropy.h"
#include "titan/kernels/ref/cross_entropy.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

namespace {

// Validates logits [N, V] and targets [N]; returns the number of valid targets.
int64_t check(const char* op, const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  detail::check_activation(logits, op, "logits");
  TITAN_CHECK(logits.dim() == 2, std::string(op) + ": logits must be [N, V], got " + logits.str(),
              "flatten batch and sequence with .view({-1, V})");
  const int64_t n = logits.size(0), v = logits.size(1);
  TITAN_CHECK(v > 0, std::string(op) + ": logits have an empty vocabulary dim: " + logits.str(),
              "V is the model's vocab_size");
  TITAN_CHECK(targets.dtype() == DType::i32 && targets.is_contiguous() && targets.numel() == n,
              std::string(op) + ": targets must be contiguous i32 [" + std::to_string(n) + "], got " + targets.str(),
              "one target token id per logits row");
  const int32_t* t = targets.data<int32_t>();
  int64_t valid = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore_index) continue;
    TITAN_CHECK(t[r] >= 0 && t[r] < v,
                std::string(op) + ": target " + std::to_string(t[r]) + " of row " + std::to_string(r) +
                    " is outside the vocabulary [0, " + std::to_string(v) + ")",
                "targets are token ids below vocab_size, or ignore_index (" + std::to_string(ignore_index) +
                    ") for masked positions");
    ++valid;
  }
  return valid;
}

}  // namespace

CrossEntropyResult cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                                         int32_t ignore_index) {
  const int64_t valid = check("cross_entropy_forward", logits, targets, ignore_index);
  const int64_t n = logits.size(0), v = logits.size(1);
  detail::check_f32(loss, n, "cross_entropy_forward", "loss");
  detail::check_f32(lse, n, "cross_entropy_forward", "lse");
  detail::dispatch_activation(logits.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(cross_entropy_forward<T>) : &ref::cross_entropy_forward<T>)(
        loss.data<float>(), lse.data<float>(), logits.data<T>(), targets.data<int32_t>(), n, v, ignore_index);
  });
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) sum += loss.data<float>()[r];
  return {valid > 0 ? sum / double(valid) : 0.0, valid};
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dloss, int32_t ignore_index) {
  check("cross_entropy_backward", logits, targets, ignore_index);
  const int64_t n = logits.size(0), v = logits.size(1);
  detail::check_like(dlogits, logits, "cross_entropy_backward", "dlogits");
  detail::check_f32(lse, n, "cross_entropy_backward", "lse");
  if (dloss.defined()) detail::check_f32(dloss, n, "cross_entropy_backward", "dloss");
  const float* dl = dloss.defined() ? dloss.data<float>() : nullptr;
  detail::dispatch_activation(logits.dtype(), [&]<class T>() {
    (detail::use_fast() ? TITAN_CPU_KERNEL(cross_entropy_backward<T>) : &ref::cross_entropy_backward<T>)(
        dlogits.data<T>(), logits.data<T>(), targets.data<int32_t>(), lse.data<float>(), dl, float(scale), n, v,
        ignore_index);
  });
}

void cross_entropy_mean_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 double dmean, int32_t ignore_index) {
  const int64_t valid = check("cross_entropy_mean_backward", logits, targets, ignore_index);
  // No valid token: the mean is the constant 0, so every gradient is 0 (scale 0 gives exactly that).
  cross_entropy_backward(dlogits, logits, targets, lse, valid > 0 ? dmean / double(valid) : 0.0, {}, ignore_index);
}

}  // namespace titan::kernels
