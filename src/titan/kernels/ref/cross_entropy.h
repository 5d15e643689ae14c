// Reference: softmax cross-entropy over the vocabulary, fused with log-softmax. Only the per-row
// log-sum-exp is saved; the [N, V] probabilities are recomputed in backward, never stored.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// lse[n] = log sum_j exp(logits[n, j]); loss[n] = lse[n] - logits[n, targets[n]]. Rows whose
// target is ignore_index get loss 0 and lse 0 (they are skipped: no work, no gradient).
template <class T>
void cross_entropy_forward(acc_t<T>* loss,         // [N]
                           acc_t<T>* lse,          // [N]
                           const T* logits,        // [N, V]
                           const int32_t* targets, // [N], each in [0, V) or ignore_index
                           int64_t n, int64_t v, int32_t ignore_index);

// dlogits[n, j] = (exp(logits[n, j] - lse[n]) - [j == targets[n]]) * g[n] with
// g[n] = scale * (dloss ? dloss[n] : 1); ignored rows get 0. For the mean over valid tokens,
// scale = dmean / n_valid and dloss = nullptr. Writes (does not accumulate: the loss is where
// backward starts, so nothing else adds to dlogits, and accumulating would cost one more pass
// over the largest tensor of the step); dlogits may be logits itself (in place).
template <class T>
void cross_entropy_backward(T* dlogits,               // [N, V]
                            const T* logits,          // [N, V]
                            const int32_t* targets,   // [N]
                            const acc_t<T>* lse,      // [N]
                            const acc_t<T>* dloss,    // [N] or nullptr
                            acc_t<T> scale, int64_t n, int64_t v, int32_t ignore_index);

}  // namespace titan::kernels::ref
