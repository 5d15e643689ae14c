#include "titan/models/indexer_kl.h"

#include "titan/core/profiler.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/lightning_indexer.h"

namespace titan::models {

using autograd::GradSink;
using autograd::Variable;

Variable indexer_kl(const Variable& q, const Variable& k, const Variable& w, const IndexerTarget& target) {
  ProfileScope prof("indexer_kl_loss.fwd");
  const double rows = double(q.shape()[0] * q.shape()[1]);
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), MemCategory::activations);
  Tensor dk = Tensor::empty(k.shape(), k.dtype(), MemCategory::activations);
  Tensor dw = Tensor::empty(w.shape(), DType::f32, MemCategory::activations);
  const double total =
      target.idx.defined()
          ? kernels::indexer_kl_loss_sparse(dq, dk, dw, q.value(), k.value(), w.value(), target.idx, target.head_mean,
                                            1.0 / rows, target.ratio, target.pos0)
          : kernels::indexer_kl_loss(dq, dk, dw, q.value(), k.value(), w.value(), target.mq, target.mk, target.mlse,
                                     target.scale, 1.0 / rows);
  return autograd::record("indexer_kl_loss", {q, k, w}, Tensor::full({1}, total / rows, DType::f32),
                          [dq, dk, dw](const Tensor& dloss, GradSink& g) {
                            ProfileScope prof_bwd("indexer_kl_loss.bwd");
                            const double d = dloss.item();
                            const Tensor* grads[3] = {&dq, &dk, &dw};
                            for (size_t i = 0; i < 3; ++i) {
                              if (!g.needs(i)) continue;
                              Tensor gi = g.grad(i);
                              kernels::axpby(gi, *grads[i], d, 1.0);
                            }
                          });
}

}  // namespace titan::models
