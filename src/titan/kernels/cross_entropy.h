// Tensor-level softmax cross-entropy fused with log-softmax (semantics: ref/cross_entropy.h).
// Logits are [N, V] f32 or bf16 (V up to 128K+); only the per-row log-sum-exp is saved.
#pragma once

#include <cstdint>

#include "titan/core/tensor.h"

namespace titan::kernels {

inline constexpr int32_t kIgnoreIndex = -100;  // PyTorch's default: targets equal to it are masked

struct CrossEntropyResult {
  double mean_loss = 0;  // sum of loss over valid tokens / valid (0 when none is valid)
  int64_t valid = 0;     // tokens whose target is not ignore_index
};

// loss [N] and lse [N] (f32) from logits [N, V] and targets [N] (i32, each in [0, V) or
// ignore_index). The mean is summed in double in token order (deterministic).
CrossEntropyResult cross_entropy_forward(Tensor& loss, Tensor& lse, const Tensor& logits, const Tensor& targets,
                                         int32_t ignore_index = kIgnoreIndex);

// dlogits [N, V] = (softmax - onehot) * g[n], g[n] = scale * (dloss defined ? dloss[n] : 1);
// dlogits may be logits (in place). Writes, does not accumulate (see ref/cross_entropy.h).
void cross_entropy_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            double scale, const Tensor& dloss = {}, int32_t ignore_index = kIgnoreIndex);

// The gradient of the mean loss: g[n] = dmean / valid for valid tokens.
void cross_entropy_mean_backward(Tensor& dlogits, const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                 double dmean, int32_t ignore_index = kIgnoreIndex);

}  // namespace titan::kernels
