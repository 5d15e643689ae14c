#include "titan/kernels/cross_entropy.h"

#include <string>

#include "titan/kernels/cpu/cross_entropy.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/cross_entropy.h"

namespace titan::kernels {

namespace {

// Validates logits [N, V] and targets [N]; returns the number of valid targets.
int64_t check(const char* op, const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  TITAN_CHECK(logits.dim() == 2 && logits.is_contiguous() &&
                  (logits.dtype() == DType::f32 || logits.dtype() == DType::bf16),
              std::string(op) + ": logits must be contiguous f32/bf16 [N, V], got " + logits.str(),
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

void check_stat(const char* op, const char* name, const Tensor& t, int64_t n) {
  TITAN_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == n,
              std::string(op) + ": " + name + " must be contiguous f32 [" + std::to_string(n) + "], got " + t.str(),
              "per-token losses and statistics are f32");
}

}  // namespace

CrossEntropyResult cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                                         int32_t ignore_index) {
  const int64_t valid = check("cross_entropy_forward", logits, targets, ignore_index);
  const int64_t n = logits.size(0), v = logits.size(1);
  check_stat("cross_entropy_forward", "loss", loss, n);
  check_stat("cross_entropy_forward", "lse", lse, n);
  const bool fast = kernel_backend() == KernelBackend::fast;
  const int32_t* t = targets.data<int32_t>();
  if (logits.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(cross_entropy_forward<float>) : &ref::cross_entropy_forward<float>)(
        loss.data<float>(), lse.data<float>(), logits.data<float>(), t, n, v, ignore_index);
  } else {
    (fast ? TITAN_CPU_KERNEL(cross_entropy_forward<bf16>) : &ref::cross_entropy_forward<bf16>)(
        loss.data<float>(), lse.data<float>(), logits.data<bf16>(), t, n, v, ignore_index);
  }
  double sum = 0;
  for (int64_t r = 0; r < n; ++r) sum += loss.data<float>()[r];
  return {valid > 0 ? sum / double(valid) : 0.0, valid};
}

void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dloss, int32_t ignore_index) {
  check("cross_entropy_backward", logits, targets, ignore_index);
  const int64_t n = logits.size(0), v = logits.size(1);
  TITAN_CHECK(dlogits.shape() == logits.shape() && dlogits.dtype() == logits.dtype() && dlogits.is_contiguous(),
              "cross_entropy_backward: dlogits " + dlogits.str() + " must match logits " + logits.str(),
              "allocate dlogits like logits, or pass logits itself to overwrite it in place");
  check_stat("cross_entropy_backward", "lse", lse, n);
  if (dloss.defined()) check_stat("cross_entropy_backward", "dloss", dloss, n);
  const bool fast = kernel_backend() == KernelBackend::fast;
  const int32_t* t = targets.data<int32_t>();
  const float* dl = dloss.defined() ? dloss.data<float>() : nullptr;
  if (logits.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(cross_entropy_backward<float>) : &ref::cross_entropy_backward<float>)(
        dlogits.data<float>(), logits.data<float>(), t, lse.data<float>(), dl, float(scale), n, v, ignore_index);
  } else {
    (fast ? TITAN_CPU_KERNEL(cross_entropy_backward<bf16>) : &ref::cross_entropy_backward<bf16>)(
        dlogits.data<bf16>(), logits.data<bf16>(), t, lse.data<float>(), dl, float(scale), n, v, ignore_index);
  }
}

void cross_entropy_mean_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 double dmean, int32_t ignore_index) {
  const int64_t valid = check("cross_entropy_mean_backward", logits, targets, ignore_index);
  // No valid token: the mean is the constant 0, so every gradient is 0 (scale 0 gives exactly that).
  cross_entropy_backward(dlogits, logits, targets, lse, valid > 0 ? dmean / double(valid) : 0.0, {}, ignore_index);
}

}  // namespace titan::kernels
