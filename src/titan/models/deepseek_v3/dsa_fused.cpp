// DSA: the fused implementation (see dsa.h), over the kernels of lightning_indexer.h and
// sparse_mla.h. Sparse stage in MLA's absorbed form:
//   Q [B, S, H, d_c + d_r] = [q_nope,h W_UK,h | q_rope,h],   KV [B, S, d_c + d_r] = [c | k_rope]
//   O_lat = sparse attention over the selected KV rows,       o_h = O_lat,h W_UV,h^T
// with W_UK / W_UV wkv_b's key / value rows per head, taken through differentiable views of
// wkv_b's weight so that their gradients accumulate into it.
#include "titan/models/deepseek_v3/dsa.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "titan/autograd/ops.h"
#include "titan/core/profiler.h"
#include "titan/distributed/process_group.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/attention_unmasked.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/sparse_mla.h"
#include "titan/models/indexer_kl.h"

namespace titan::models::deepseek_v3 {

using namespace autograd;

namespace {
// dst += src (same shape; f32 or both of one dtype).
void accumulate(Tensor& dst, const Tensor& src) { kernels::axpby(dst, src, 1.0, 1.0); }

// O_lat [B, S, H, Dv] of the sparse attention. head_mean (optional, [B, S, K] f32, allocated
// here): the head mean of its probabilities per slot of idx, the indexer's KL target (detached).
Variable sparse_mla(const Variable& q, const Variable& kv, const Tensor& idx, int64_t dv, double scale,
                    Tensor* head_mean) {
  ProfileScope prof("sparse_mla.fwd");
  const Shape& qs = q.shape();
  Tensor o = Tensor::empty({qs[0], qs[1], qs[2], dv}, q.dtype(), MemCategory::activations);
  Tensor lse = Tensor::empty({qs[0], qs[1], qs[2]}, DType::f32, MemCategory::activations);
  if (head_mean) *head_mean = Tensor::empty(idx.shape(), DType::f32, MemCategory::activations);
  kernels::sparse_mla_forward(o, lse, q.value(), kv.value(), idx, dv, scale, head_mean);
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

// Under tensor parallelism: x [B, S, h, ...] (this rank's h heads) -> [B, S, tp * h, ...], every
// rank's heads in rank order (the indexer's dense-stage target reads all of them; no gradient).
Tensor gather_heads(const Tensor& x, const distributed::ProcessGroup& tp) {
  const Tensor local = x.contiguous();
  const int t = tp.size();
  Tensor ranks = Tensor::empty({t * local.numel()}, local.dtype());
  tp.all_gather(ranks, local.view({local.numel()})).wait();
  std::vector<int64_t> dims(local.shape().begin(), local.shape().end());
  const int64_t rows = dims[0] * dims[1], per_row = local.numel() / rows;  // one token's heads
  dims[2] *= t;
  Tensor out = Tensor::empty(Shape(dims), local.dtype(), MemCategory::activations);
  const size_t bytes = size_t(per_row) * size_t(dtype_bits(local.dtype()) / 8);
  for (int r = 0; r < t; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(out.data_ptr()) + (size_t(i) * t + size_t(r)) * bytes,
                  static_cast<const char*>(ranks.data_ptr()) + (size_t(r) * rows + size_t(i)) * bytes, bytes);
  return out;
}

// MLA's weight absorption, per head h with W_h = wkv_b's rows of head h, [d_n + d_v, d_c]:
// W_UK,h = its first d_n rows, W_UV,h = the last d_v. Both products run as one batched GEMM over
// heads on strided views ([H, N, X] views of [N, H, X] activations and of wkv_b itself), so no
// transposes, casts or concatenations are materialized. Under mixed precision the GEMMs read
// wkv_b's bf16 compute copy; weight gradients accumulate in f32 into wkv_b's master gradient.
struct Absorption {
  int64_t h, dn, dr, dv, dc;
  // wkv_b's weight per head [H, d_n + d_v, d_c], in the compute dtype.
  Tensor weight(const Variable& wkv_b, const Tensor& w_compute) const {
    return (w_compute.defined() ? w_compute : wkv_b.value()).view({h, dn + dv, dc});
  }
};

// [N, H, width] rows -> the [H, N, count] view of columns [col, col + count).
Tensor heads_view(const Tensor& x, int64_t n, int64_t h, int64_t col, int64_t count) {
  return x.view({n, h, x.size(-1)}).narrow(2, col, count).transpose(0, 1);
}

// Q [B, S, H, d_c + d_r] = [q_nope,h W_UK,h | q_rope,h] from q [B, S, H, d_n + d_r].
Variable absorb_query(const Variable& q, const Variable& wkv_b, const Tensor& w_compute, const Absorption& a) {
  ProfileScope prof("mla_absorb_query.fwd");
  const Shape& qs = q.shape();
  const int64_t n = qs[0] * qs[1];
  const Tensor w = a.weight(wkv_b, w_compute);
  Tensor out = Tensor::empty({qs[0], qs[1], a.h, a.dc + a.dr}, q.dtype(), MemCategory::activations);
  {
    Tensor lat = heads_view(out, n, a.h, 0, a.dc);                                    // [H, N, d_c]
    kernels::matmul(lat, heads_view(q.value(), n, a.h, 0, a.dn), w.narrow(1, 0, a.dn), false, false);
  }
  kernels::copy_columns(out, a.dc, q.value(), a.dn, a.dr);
  return record("mla_absorb_query", {q, wkv_b}, out, [qv = q.value(), w, a, n](const Tensor& dout, GradSink& g) {
    ProfileScope prof_bwd("mla_absorb_query.bwd");
    const Tensor d = dout.contiguous();
    const Tensor d_lat = heads_view(d, n, a.h, 0, a.dc);  // [H, N, d_c]
    if (g.needs(0)) {
      // Written outright while q's gradient is still zero (grad_to_write: the usual case): the
      // nope columns by the product, the rope columns by a copy.
      bool accumulate = true;
      Tensor dq = g.grad_to_write(0, &accumulate);
      Tensor dq_nope = heads_view(dq, n, a.h, 0, a.dn);  // [H, N, d_n] (+)= dQ_lat W_UK^T
      kernels::matmul(dq_nope, d_lat, w.narrow(1, 0, a.dn), false, true, 1, accumulate ? 1 : 0);
      if (accumulate) {
        kernels::add_columns(dq, a.dn, d, a.dc, a.dr);
      } else {
        kernels::copy_columns(dq, a.dn, d, a.dc, a.dr);
      }
    }
    if (g.needs(1)) {
      Tensor dw = g.grad(1).view({a.h, a.dn + a.dv, a.dc}).narrow(1, 0, a.dn);  // [H, d_n, d_c] += q_nope^T dQ_lat
      kernels::matmul(dw, heads_view(qv, n, a.h, 0, a.dn), d_lat, true, false, 1, 1);
    }
  });
}

// o [B, S, H, d_v] = O_lat,h W_UV,h^T from the sparse attention's O_lat [B, S, H, d_c].
Variable unabsorb_output(const Variable& o_lat, const Variable& wkv_b, const Tensor& w_compute, const Absorption& a) {
  ProfileScope prof("mla_unabsorb_output.fwd");
  const Shape& os = o_lat.shape();
  const int64_t n = os[0] * os[1];
  const Tensor w_uv = a.weight(wkv_b, w_compute).narrow(1, a.dn, a.dv);  // [H, d_v, d_c]
  Tensor out = Tensor::empty({os[0], os[1], a.h, a.dv}, o_lat.dtype(), MemCategory::activations);
  {
    Tensor o_heads = heads_view(out, n, a.h, 0, a.dv);  // [H, N, d_v]
    kernels::matmul(o_heads, heads_view(o_lat.value(), n, a.h, 0, a.dc), w_uv, false, true);
  }
  return record("mla_unabsorb_output", {o_lat, wkv_b}, out,
                [lat = o_lat.value(), w_uv, a, n](const Tensor& dout, GradSink& g) {
                  ProfileScope prof_bwd("mla_unabsorb_output.bwd");
                  const Tensor d = heads_view(dout.contiguous(), n, a.h, 0, a.dv);  // [H, N, d_v]
                  if (g.needs(0)) {  // written while O_lat's gradient is still zero (as above)
                    bool accumulate = true;
                    Tensor dlat = heads_view(g.grad_to_write(0, &accumulate), n, a.h, 0, a.dc);  // [H, N, d_c]
                    kernels::matmul(dlat, d, w_uv, false, false, 1, accumulate ? 1 : 0);
                  }
                  if (g.needs(1)) {
                    Tensor dw = g.grad(1).view({a.h, a.dn + a.dv, a.dc}).narrow(1, a.dn, a.dv);  // += dO^T O_lat
                    kernels::matmul(dw, d, heads_view(lat, n, a.h, 0, a.dc), true, false, 1, 1);
                  }
                });
}

// Causal attention of the last S positions of a key prefix in MLA's absorbed (MQA) form: the
// queries' own block (causal) merged by log-sum-exp with the block of the earlier keys (no mask).
// q [B, S, H, d_c + d_r], kv [B, Skv, d_c + d_r] latent rows [c | k_rope] (key: the whole row,
// value: its first d_c); o [B, S, H, d_c] in q's dtype, lse [B, H, S] f32.
void prefix_attention(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, int64_t dc, double scale) {
  const int64_t b = q.size(0), s = q.size(1), width = kv.size(2), before = kv.size(1) - s;
  const auto keys = [&](int64_t from, int64_t count) {
    return kv.narrow(1, from, count).contiguous().view({b, count, 1, width});
  };
  const auto values = [dc](const Tensor& k) { return k.narrow(3, 0, dc).contiguous(); };
  const Tensor own = keys(before, s);
  kernels::attention_forward(o, lse, q, own, values(own), scale);
  if (before == 0) return;
  Tensor merged = o.dtype() == DType::f32 ? o : o.to(DType::f32);
  Tensor part = Tensor::empty(o.shape(), o.dtype()), part_lse = Tensor::empty(lse.shape(), DType::f32);
  const Tensor early = keys(0, before);
  kernels::attention_unmasked_forward(part, part_lse, q, early, values(early), scale);
  kernels::attention_merge(merged, lse, part, part_lse, 0);
  if (merged.data_ptr() != o.data_ptr()) o.copy_(merged);
}

// The dense warm-up over a gathered key prefix (context parallel): dense attention in the
// absorbed form over the latent rows every rank gathered, and the indexer's KL against its
// head-mean probabilities over every causal key. The warm-up trains only the indexer, so the
// attention output carries no gradient (the main model is frozen).
DsaOutputs dense_warmup_over_prefix(const DsaInputs& in) {
  TITAN_CHECK(!in.wkv_b.requires_grad() && !in.kv_keys.requires_grad(),
              "DSA: the dense warm-up over gathered keys needs the main model frozen (set_dsa(dense_warmup))");
  const int64_t b = in.q.shape()[0], s = in.q.shape()[1], h = in.n_heads, skv = in.kv_keys.shape()[1];
  const int64_t dc = in.latent_dim, dr = in.rope_dim;
  const Absorption absorb{h, in.nope_dim, dr, in.v_dim, dc};
  const Tensor q = absorb_query(in.q, in.wkv_b, in.wkv_b_compute, absorb).value();  // [B, S, H, d_c + d_r]
  const Tensor kv = in.kv_keys.value().contiguous();                                 // [B, Skv, d_c + d_r]
  Tensor o_lat = Tensor::empty({b, s, h, dc}, q.dtype(), MemCategory::activations);
  Tensor lse = Tensor::empty({b, h, s}, DType::f32, MemCategory::activations);
  prefix_attention(o_lat, lse, q, kv, dc, in.scale);
  DsaOutputs out;
  out.o = unabsorb_output(Variable(o_lat), in.wkv_b, in.wkv_b_compute, absorb);  // [B, S, H, d_v]
  if (!in.want_loss) return out;
  Tensor mq = q, lse_rows = lse.transpose(1, 2).contiguous();  // [B, S, H], as the loss reads it
  if (in.tp) {  // the target averages over every rank's heads; the latent key is shared by all
    mq = gather_heads(mq, *in.tp);
    lse_rows = gather_heads(lse_rows.view({b, s, h, 1}), *in.tp).view({b, s, h * in.tp->size()});
  }
  out.loss = indexer_kl(in.index_q, in.index_k, in.index_w, {mq, kv.view({b, skv, 1, dc + dr}), lse_rows, in.scale, {}, {}});
  return out;
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
    if (in.kv_keys.defined()) return dense_warmup_over_prefix(in);
    // Dense MLA (standard form); its lse gives the indexer's target p = head mean of its rows.
    Variable kv_up = view(linear(in.c, in.wkv_b, in.wkv_b_compute), {b, s, h, dn + dv});
    Variable k = concat_last(narrow_last(kv_up, 0, dn), in.k_rope);  // [B, S, H, d_qk]
    Variable v = narrow_last(kv_up, dn, dv);                           // [B, S, H, d_v]
    Tensor lse;                                                        // [B, H, S]
    out.o = attention(in.q, k, v, in.scale, &lse);
    if (in.want_loss) {
      Tensor lse_rows = lse.transpose(1, 2).contiguous();  // [B, S, H], as the loss reads it
      Tensor mq = in.q.value(), mk = k.value();
      if (in.tp) {  // the target averages over every rank's heads
        mq = gather_heads(mq, *in.tp), mk = gather_heads(mk, *in.tp);
        lse_rows = gather_heads(lse_rows.view({b, s, h, 1}), *in.tp).view({b, s, h * in.tp->size()});
      }
      out.loss = indexer_kl(in.index_q, in.index_k, in.index_w, {mq, mk, lse_rows, in.scale, {}, {}});
    }
    return out;
  }

  // Keys: this sequence's own rows, or (context parallel) a gathered prefix whose last S are the queries.
  const int64_t skv = in.kv_keys.defined() ? in.kv_keys.shape()[1] : s;
  Tensor idx = Tensor::empty({b, s, std::min(in.topk, skv)}, DType::i32, MemCategory::activations);  // [B, S, K]
  kernels::indexer_topk(idx, in.index_q.value(), in.index_k.value(), in.index_w.value());

  const Absorption absorb{h, dn, dr, dv, dc};
  Variable q_full = absorb_query(in.q, in.wkv_b, in.wkv_b_compute, absorb);  // [B, S, H, d_c + d_r]
  Variable kv = in.kv_keys.defined() ? in.kv_keys : view(concat_last(in.c, in.k_rope), {b, s, dc + dr});  // [B, Skv, d_c + d_r]
  // The target is the sparse attention's own probabilities over the selected keys, averaged over
  // heads by its forward (which has them at hand) per slot of idx.
  Tensor head_mean;                                                                              // [B, S, K]
  Variable o_lat = sparse_mla(q_full, kv, idx, dc, in.scale, in.want_loss ? &head_mean : nullptr);  // [B, S, H, d_c]
  if (in.want_loss && in.tp) {  // each rank has the mean over its heads; the target is over all
    in.tp->all_reduce(head_mean).wait();
    kernels::scale(head_mean, head_mean, 1.0 / in.tp->size());
  }
  out.o = unabsorb_output(o_lat, in.wkv_b, in.wkv_b_compute, absorb);                          // [B, S, H, d_v]
  if (in.want_loss) out.loss = indexer_kl(in.index_q, in.index_k, in.index_w, {{}, {}, {}, 0, idx, head_mean, 1});
  return out;
}

}  // namespace titan::models::deepseek_v3
