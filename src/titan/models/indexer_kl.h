// The lightning indexer's KL loss as an autograd op, shared by DeepSeek-V3.2's DSA and
// DeepSeek-V4's CSA (docs/dsa.md section 6; kernels/lightning_indexer.h): the mean over the
// B * S query rows of KL(target || softmax(I)), a one-element Variable of the indexer's q, k and
// w. The kernel yields the gradients in the same pass as the loss, so the forward keeps them
// (scaled for the mean) and the backward scales them by the incoming gradient.
#pragma once

#include "titan/autograd/variable.h"

namespace titan::models {

struct IndexerTarget {
  // Dense stage (V3.2's warm-up): the target recomputed from the main attention's queries, keys
  // and lse, with its softmax scale.
  Tensor mq, mk, mlse;
  double scale = 0;
  // Sparse stage: the selection [B, S, K] and the attention's head mean per slot [B, S, K] f32.
  Tensor idx, head_mean;
  int64_t ratio = 1;  // raw positions per key (V4's CSA: the compress ratio)
  int64_t pos0 = 0;   // ratio > 1: the global position of the first query (a context-parallel chunk's start)
};

autograd::Variable indexer_kl(const autograd::Variable& q, const autograd::Variable& k, const autograd::Variable& w,
                              const IndexerTarget& target);

}  // namespace titan::models
