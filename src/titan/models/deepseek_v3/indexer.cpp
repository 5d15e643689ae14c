#include "titan/models/deepseek_v3/indexer.h"

#include <cmath>

namespace titan::models::deepseek_v3 {

namespace {
std::unique_ptr<nn::Linear> linear(int64_t in, int64_t out) {
  return std::make_unique<nn::Linear>(in, out, nn::Init::trunc_normal(DeepSeekV3Args::kInitStd));
}
}  // namespace

Indexer::Indexer(const DeepSeekV3Args& a)
    : wq_b(register_module("wq_b", linear(a.q_lora_rank, a.index_n_heads * a.index_head_dim))),
      wk(register_module("wk", linear(a.dim, a.index_head_dim))),
      k_norm(register_module("k_norm", std::make_unique<nn::LayerNorm>(a.index_head_dim, DeepSeekV3Args::kIndexerNormEps))),
      weights_proj(register_module("weights_proj", linear(a.dim, a.index_n_heads))),
      n_heads_(a.index_n_heads),
      head_dim_(a.index_head_dim),
      hadamard_(a.index_hadamard) {}

Indexer::Outputs Indexer::forward(const Variable& x, const Variable& qr, const kernels::RopeTables& rope,
                                  const Tensor& positions, DsaImpl impl) const {
  const int64_t b = x.shape()[0], s = x.shape()[1];
  Variable q = autograd::view(wq_b.forward(qr), {b, s, n_heads_, head_dim_});           // [B, S, HI, DI]
  Variable k = autograd::view(k_norm.forward(wk.forward(x)), {b, s, 1, head_dim_});    // [B, S, 1, DI]
  // The rope part is the head's first d_r dims, paired rotate-half (DeepSeek's "fix indexer rope").
  q = apply_rope(q, rope, positions, kernels::RopeLayout::rotate_half, 0);
  k = apply_rope(k, rope, positions, kernels::RopeLayout::rotate_half, 0);
  if (hadamard_) {
    q = impl == DsaImpl::fused ? hadamard_fused(q) : hadamard_small_ops(q);
    k = impl == DsaImpl::fused ? hadamard_fused(k) : hadamard_small_ops(k);
  }
  // Head weights in f32 with both scalings folded in; no activation, so they may be negative.
  const double w_scale = 1.0 / std::sqrt(double(n_heads_) * double(head_dim_));
  Variable w = autograd::scale(autograd::cast(weights_proj.forward(x), DType::f32), w_scale);  // [B, S, HI]
  return {q, autograd::view(k, {b, s, head_dim_}), w};
}

}  // namespace titan::models::deepseek_v3
