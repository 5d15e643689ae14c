// DSA: the fused implementation (see dsa.h), over the kernels of lightning_indexer.h and
// sparse_mla.h. Sparse stage in MLA's absorbed form:
//   Q [B, S, H, d_c + d_r] = [q_nope,h W_UK,h | q_rope,h],   KV [B, S, d_c + d_r] = [c | k_rope]
//   O_lat = sparse attention over the selected KV rows,       o_h = O_lat,h W_UV,h^T
// with W_UK / W_UV wkv_b's key / value rows per head, taken through differentiable views of
// wkv_b's weight so that their gradients accumulate into it.
#include "titan/models/deepseek_v3/dsa.h"

#include <algorithm>

#include "titan/autograd/ops.h"
#include "titan/core/profiler.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/sparse_mla.h"

namespace titan::models::deepseek_v3 {

using namespace autograd;

namespace {
// dst += src (same shape; f32 or both of one dtype).
void accumulate(Tensor& dst, const Tensor& src) { kernels::axpby(dst, src, 1.0, 1.0); }

// O_lat [B, S, H, Dv] of the sparse attention; lse_out [B, S, H] (natural log).
Variable sparse_mla(const Variable& q, const Variable& kv, const Tensor& idx, int64_t dv, double scale,
                    Tensor& lse_out) {
  ProfileScope prof("sparse_mla.fwd");
  const Shape& qs = q.shape();
  Tensor o = Tensor::empty({qs[0], qs[1], qs[2], dv}, q.dtype(), MemCategory::activations);
  Tensor lse = Tensor::empty({qs[0], qs[1], qs[2]}, DType::f32, MemCategory::activations);
  kernels::sparse_mla_forward(o, lse, q.value(), kv.value(), idx, dv, scale);
  lse_out = lse;
  return record("sparse_mla", {q, kv}, o,
                [qv = q.value(), kvv = kv.value(), idx, o, lse, scale](const Tensor& dout, GradSink& g) {
                  ProfileScope prof_bwd("sparse_mla.bwd");
                  // The kernel overwrites its gradients: compute them apart, then accumulate.
                  Tensor dq = Tensor::empty(qv.shape(), qv.dtype());
                  Tensor dkv = Tensor::empty(kvv.shape(), kvv.dtype());
                  kernels::sparse_mla_backward(dq, dkv, dout.contiguous(), qv, kvv, idx, o, lse, scale);
                  if (g.needs(0) && !g.adopt(0, dq)) {
                    Tensor d = g.grad(0);
                    accumulate(d, dq);
                  }
                  if (g.needs(1) && !g.adopt(1, dkv)) {
                    Tensor d = g.grad(1);
                    accumulate(d, dkv);
                  }
                });
}

// The indexer's KL loss (mean over the B * S rows) as a one-element Variable of q, k, w. The
// kernel yields the gradients in the same pass as the loss, so the forward keeps them (for the
// mean: grad_scale = 1 / rows) and the backward scales them by the incoming gradient.
Variable indexer_kl(const Variable& q, const Variable& k, const Variable& w, const Tensor& mq, const Tensor& mk,
                    const Tensor& mlse, double scale, const Tensor& idx) {
  ProfileScope prof("indexer_kl_loss.fwd");
  const double rows = double(q.shape()[0] * q.shape()[1]);
  Tensor dq = Tensor::empty(q.shape(), q.dtype(), MemCategory::activations);
  Tensor dk = Tensor::empty(k.shape(), k.dtype(), MemCategory::activations);
  Tensor dw = Tensor::empty(w.shape(), DType::f32, MemCategory::activations);
  const double total = kernels::indexer_kl_loss(dq, dk, dw, q.value(), k.value(), w.value(), mq, mk, mlse, scale,
                                                idx, 1.0 / rows);
  return record("indexer_kl_loss", {q, k, w}, Tensor::full({1}, total / rows, DType::f32),
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

// [B, S, H, X] -> [H, B * S, X] (heads first, for per-head GEMMs) and back.
Variable heads_first(const Variable& x) {
  const Shape& s = x.shape();
  return transpose(view(x, {s[0] * s[1], s[2], s[3]}), 0, 1);
}
Variable heads_last(const Variable& x, int64_t b, int64_t s) {
  const Shape& xs = x.shape();
  return view(transpose(x, 0, 1), {b, s, xs[0], xs[2]});
}
}  // namespace

Variable hadamard_fused(const Variable& x) {
  ProfileScope prof("hadamard.fwd");
  Tensor y = x.value().clone(MemCategory::activations);
  kernels::hadamard_transform(y);
  return record("hadamard", {x}, y, [](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("hadamard.bwd");
    // Symmetric and orthonormal: the transform is its own transpose.
    Tensor d = dy.clone();
    kernels::hadamard_transform(d);
    if (g.adopt(0, d)) return;
    Tensor dx = g.grad(0);
    accumulate(dx, d);
  });
}

DsaOutputs dsa_attention_fused(const DsaInputs& in) {
  const int64_t b = in.q.shape()[0], s = in.q.shape()[1], h = in.n_heads;
  const int64_t dn = in.nope_dim, dr = in.rope_dim, dv = in.v_dim, dc = in.latent_dim;
  DsaOutputs out;
  if (in.stage == DsaStage::dense_warmup) {
    // Dense MLA (standard form); its lse gives the indexer's target p = head mean of its rows.
    Variable kv_up = view(linear(in.c, in.wkv_b), {b, s, h, dn + dv});
    Variable k = concat_last(narrow_last(kv_up, 0, dn), in.k_rope);  // [B, S, H, d_qk]
    Variable v = narrow_last(kv_up, dn, dv);                           // [B, S, H, d_v]
    Tensor lse;                                                        // [B, H, S]
    out.o = attention(in.q, k, v, in.scale, &lse);
    if (in.want_loss) {
      const Tensor lse_rows = lse.transpose(1, 2).contiguous();  // [B, S, H], as the loss reads it
      out.loss = indexer_kl(in.index_q, in.index_k, in.index_w, in.q.value(), k.value(), lse_rows, in.scale, Tensor());
    }
    return out;
  }

  Tensor idx = Tensor::empty({b, s, std::min(in.topk, s)}, DType::i32, MemCategory::activations);  // [B, S, K]
  kernels::indexer_topk(idx, in.index_q.value(), in.index_k.value(), in.index_w.value());

  // wkv_b [H * (d_n + d_v), d_c] -> per head [H, d_c, d_n + d_v]: W_UK^T | W_UV^T.
  Variable w_t = transpose(view(in.wkv_b, {h, dn + dv, dc}), 1, 2);
  Variable w_uk_t = narrow_last(w_t, 0, dn);   // [H, d_c, d_n]
  Variable w_uv_t = narrow_last(w_t, dn, dv);  // [H, d_c, d_v]
  Variable q_abs = heads_last(matmul(heads_first(narrow_last(in.q, 0, dn)), w_uk_t, false, true), b, s);  // [B, S, H, d_c]
  Variable q_full = concat_last(q_abs, narrow_last(in.q, dn, dr));                                     // [B, S, H, d_c + d_r]
  Variable kv = view(concat_last(in.c, in.k_rope), {b, s, dc + dr});                                   // [B, S, d_c + d_r]
  Tensor lse;  // [B, S, H]
  Variable o_lat = sparse_mla(q_full, kv, idx, dc, in.scale, lse);  // [B, S, H, d_c]
  out.o = heads_last(matmul(heads_first(o_lat), w_uv_t), b, s);    // [B, S, H, d_v]
  if (in.want_loss) {
    // The target is the sparse attention's own probabilities over the selected keys (its lse).
    out.loss = indexer_kl(in.index_q, in.index_k, in.index_w, q_full.value(), kv.value().view({b, s, 1, dc + dr}), lse,
                          in.scale, idx);
  }
  return out;
}

}  // namespace titan::models::deepseek_v3
