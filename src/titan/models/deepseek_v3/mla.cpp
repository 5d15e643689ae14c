#include "titan/models/deepseek_v3/mla.h"


#include "titan/distributed/async_tensor_parallel.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/ring_attention.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/attention_decode.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/sparse_mla.h"

namespace titan::models::deepseek_v3 {

using nn::Init;

namespace {
std::unique_ptr<nn::Linear> linear(int64_t in, int64_t out, double std = DeepSeekV3Args::kInitStd) {
  return std::make_unique<nn::Linear>(in, out, Init::trunc_normal(std));
}

int64_t degree(const distributed::ProcessGroup* tp) { return tp ? tp->size() : 1; }
}  // namespace

LatentCache LatentCache::allocate(const DeepSeekV3Args& a, int64_t batch, int64_t capacity) {
  return {Tensor::zeros({batch, capacity, 1, a.kv_lora_rank + a.qk_rope_head_dim}, DType::f32, MemCategory::activations),
          Tensor::zeros({batch, capacity, 1, a.kv_lora_rank}, DType::f32, MemCategory::activations),
          a.has_indexer() ? Tensor::zeros({batch, capacity, a.index_head_dim}, DType::f32, MemCategory::activations)
                          : Tensor()};
}

Attention::Attention(const DeepSeekV3Args& a, int layer_id, const distributed::ProcessGroup* tp)
    : wq(a.q_lora_rank == 0 ? &register_module("wq", linear(a.dim, a.n_heads * a.qk_head_dim())) : nullptr),
      wq_a(a.q_lora_rank > 0 ? &register_module("wq_a", linear(a.dim, a.q_lora_rank)) : nullptr),
      q_norm(a.q_lora_rank > 0 ? &register_module("q_norm", std::make_unique<nn::RMSNorm>(a.q_lora_rank, a.norm_eps))
                               : nullptr),
      wq_b(a.q_lora_rank > 0 ? &register_module("wq_b", linear(a.q_lora_rank, a.n_heads * a.qk_head_dim()))
                             : nullptr),
      wkv_a(register_module("wkv_a", linear(a.dim, a.kv_lora_rank + a.qk_rope_head_dim))),
      kv_norm(register_module("kv_norm", std::make_unique<nn::RMSNorm>(a.kv_lora_rank, a.norm_eps))),
      wkv_b(register_module("wkv_b", linear(a.kv_lora_rank, a.n_heads * (a.qk_nope_head_dim + a.v_head_dim)))),
      wo(register_module("wo", linear(a.n_heads * a.v_head_dim, a.dim, a.out_proj_std(layer_id)))),
      indexer(a.has_indexer() ? &register_module("indexer", std::make_unique<Indexer>(a)) : nullptr),
      kv_lora_rank_(a.kv_lora_rank),
      qk_nope_(a.qk_nope_head_dim),
      qk_rope_(a.qk_rope_head_dim),
      v_dim_(a.v_head_dim),
      index_topk_(a.index_topk),
      dim_(a.dim),
      scale_(a.softmax_scale()),
      tp_(degree(tp) > 1 ? tp : nullptr) {
  wkv_b.quantizable = false;  // read directly by the absorbed / sparse attention paths
}

Attention::Projections Attention::project(const Variable& x) const {
  return {(wq ? wq : wq_a)->forward(x), wkv_a.forward(x), indexer ? x.value() : Tensor()};
}

Variable Attention::query(const Variable& q_proj, const kernels::RopeTables& rope, const Tensor& positions) const {
  if (!wq) return query_from_latent(q_norm->forward(q_proj), rope, positions);
  const int64_t b = q_proj.shape()[0], s = q_proj.shape()[1];
  Variable q = autograd::view(q_proj, {b, s, n_heads(), qk_nope_ + qk_rope_});
  return apply_rope(q, rope, positions, kernels::RopeLayout::interleaved, qk_nope_);
}

Variable Attention::query_from_latent(const Variable& qr, const kernels::RopeTables& rope,
                                      const Tensor& positions) const {
  const int64_t b = qr.shape()[0], s = qr.shape()[1];
  Variable q = autograd::view(wq_b->forward(qr), {b, s, n_heads(), qk_nope_ + qk_rope_});  // [B, S, H, d_qk]
  return apply_rope(q, rope, positions, kernels::RopeLayout::interleaved, qk_nope_);
}

Variable Attention::latent_kv(const Variable& kv_proj, const kernels::RopeTables& rope, const Tensor& positions) const {
  const int64_t b = kv_proj.shape()[0], s = kv_proj.shape()[1];
  // One "head" of width d_c + d_r whose rotated dims are its d_r tail.
  Variable kv = autograd::view(kv_proj, {b, s, 1, kv_lora_rank_ + qk_rope_});
  return apply_rope(kv, rope, positions, kernels::RopeLayout::interleaved, kv_lora_rank_);
}

Variable Attention::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                            AuxLosses* aux) const {
  if (!tp_) return wo.forward(heads(project(x), rope, positions, aux));
  // Every rank's tokens through the first projections (async TP: while they are gathered).
  const int64_t b = positions.size(0), s = positions.size(1);
  Tensor x_all;
  const std::vector<Variable> y =
      distributed::column_parallel(x, {wq ? wq : wq_a, &wkv_a}, tp_, async_tp, indexer ? &x_all : nullptr);
  const auto whole = [b, s](const Variable& v) { return autograd::view(v, {b, s, v.shape()[1]}); };
  const Projections p{whole(y[0]), whole(y[1]), indexer ? x_all.view({b, s, dim_}) : Tensor()};
  // wo's partial sums (this rank's heads) reduced to this rank's tokens (async TP: in column blocks).
  const Variable o = autograd::view(heads(p, rope, positions, aux), {b * s, n_heads() * v_dim_});
  return distributed::row_parallel(o, wo, tp_, async_tp);
}

Variable Attention::heads(const Projections& p, const kernels::RopeTables& rope, const Tensor& positions,
                          AuxLosses* aux) const {
  if (indexer) return heads_dsa(p, rope, positions, aux);
  const int64_t b = p.q.shape()[0], s = p.q.shape()[1];
  Variable q = query(p.q, rope, positions);                                  // [B, S, H, d_qk]
  Variable kv = latent_kv(p.kv, rope, positions);                            // [B, S, 1, d_c + d_r]
  Variable c = kv_norm.forward(autograd::narrow_last(kv, 0, kv_lora_rank_));  // [B, S, 1, d_c]
  Variable k_rope = autograd::narrow_last(kv, kv_lora_rank_, qk_rope_);      // [B, S, 1, d_r]
  Variable kv_up = autograd::view(wkv_b.forward(c), {b, s, n_heads(), qk_nope_ + v_dim_});
  // Keys [kv_up nope | k_rope] and values (kv_up's tail) read in place: attention over
  // mla_keys_values' [B, S, H, d_qk] keys and [B, S, H, d_v] values, without building them.
  Variable o;  // [B, S, H, d_v]
  if (cp) {  // ring attention over the assembled per-head keys and values
    const auto [k, v] = autograd::mla_keys_values(kv_up, k_rope, qk_nope_);
    o = distributed::ring_attention(q, k, v, *cp, scale_);
  } else {
    o = autograd::mla_attention(q, kv_up, k_rope, qk_nope_, scale_);
  }
  return autograd::view(o, {b, s, n_heads() * v_dim_});
}

Variable Attention::heads_dsa(const Projections& p, const kernels::RopeTables& rope, const Tensor& positions,
                              AuxLosses* aux) const {
  const int64_t b = p.q.shape()[0], s = p.q.shape()[1];
  const Variable qr = q_norm->forward(p.q);  // [B, S, q_lora_rank]
  DsaInputs in;
  in.q = query_from_latent(qr, rope, positions);
  const Variable kv = latent_kv(p.kv, rope, positions);  // [B, S, 1, d_c + d_r]
  in.c = kv_norm.forward(autograd::narrow_last(kv, 0, kv_lora_rank_));
  in.k_rope = autograd::narrow_last(kv, kv_lora_rank_, qk_rope_);
  in.wkv_b = wkv_b.weight.var;
  in.wkv_b_compute = wkv_b.weight.compute;
  // The indexer reads detached copies: none of its loss reaches the main model.
  const Indexer::Outputs idx = indexer->forward(Variable(p.x), Variable(qr.value()), rope, positions, dsa.impl);
  in.index_q = idx.q, in.index_k = idx.k, in.index_w = idx.w;
  in.n_heads = n_heads(), in.nope_dim = qk_nope_, in.rope_dim = qk_rope_, in.v_dim = v_dim_;
  in.latent_dim = kv_lora_rank_;
  in.scale = scale_;
  in.topk = dsa.topk > 0 ? dsa.topk : index_topk_;
  in.stage = dsa.stage;
  in.want_loss = autograd::grad_enabled() || autograd::in_checkpointed_forward();
  in.tp = tp_;
  const DsaOutputs out = cp                          ? dsa_context_parallel(in)
                         : dsa.impl == DsaImpl::fused ? dsa_attention_fused(in)
                                                      : dsa_attention_small_ops(in);
  // The indexer's KL (the mean over this rank's query rows; under CP the ranks' sum / cp is the
  // mean), weighted as the training loss adds it; the metric is its mean over layers.
  if (aux && out.loss.defined())
    aux->push_back({"indexer_loss", autograd::scale(out.loss, dsa.indexer_loss_coeff / (cp ? cp->size() : 1)),
                    out.loss.value().item(), true});
  return autograd::view(out.o, {b, s, n_heads() * v_dim_});
}

DsaOutputs Attention::dsa_context_parallel(const DsaInputs& in) const {
  TITAN_CHECK(dsa.impl == DsaImpl::fused, "deepseek_v32: context parallelism runs DSA with the fused kernels",
              "set model.converters = [\"dsa_fused\"]");
  const int64_t b = in.q.shape()[0], s = in.q.shape()[1];
  const distributed::CpLayout layout{cp->size(), cp->rank(), s * cp->size()};
  // Every rank's latent rows [c | k_rope] and indexer keys, in sequence order.
  const Variable rows = autograd::view(autograd::concat_last(in.c, in.k_rope), {b, s, kv_lora_rank_ + qk_rope_});
  const Variable kv_all = distributed::gather_sequence(rows, *cp, layout);          // [B, S_total, d_c + d_r]
  const Variable ik_all = distributed::gather_sequence(in.index_k, *cp, layout);    // [B, S_total, DI]
  DsaOutputs parts[2];
  for (int j = 0; j < 2; ++j) {
    // Local chunk j's queries are the last `chunk` positions of the prefix that ends with them.
    const int64_t first = j * layout.chunk(), end = layout.chunk_start(j) + layout.chunk();
    DsaInputs part = in;
    part.q = distributed::narrow_sequence(in.q, first, layout.chunk());
    part.index_q = distributed::narrow_sequence(in.index_q, first, layout.chunk());
    part.index_w = distributed::narrow_sequence(in.index_w, first, layout.chunk());
    part.kv_keys = distributed::narrow_sequence(kv_all, 0, end);
    part.index_k = distributed::narrow_sequence(ik_all, 0, end);
    parts[j] = dsa_attention_fused(part);
  }
  DsaOutputs out;
  out.o = distributed::concat_sequence(parts[0].o, parts[1].o);  // [B, S, H, d_v]
  // Each part's loss is the mean over its rows; the chunks have equal rows.
  if (parts[0].loss.defined()) out.loss = autograd::scale(autograd::add(parts[0].loss, parts[1].loss), 0.5);
  return out;
}

Tensor Attention::forward_absorbed(const Tensor& x, const kernels::RopeTables& rope, const Tensor& positions,
                                   LatentCache& cache, int64_t past) const {
  TITAN_CHECK(x.dtype() == DType::f32 && x.dim() == 3, "mla absorbed form: x must be f32 [B, T, D], got " + x.str(),
              "the absorbed form is for inference in f32; call set_compute_dtype(DType::f32)");
  autograd::NoGradGuard no_grad;
  const int64_t b = x.size(0), t = x.size(1), n = b * t, h = n_heads(), dc = kv_lora_rank_, dr = qk_rope_;
  const int64_t dn = qk_nope_, dqk = qk_nope_ + qk_rope_;
  TITAN_CHECK(cache.kv.dim() == 4 && cache.kv.size(0) == b && past >= 0 && past + t <= cache.kv.size(1),
              "mla absorbed form: tokens [" + std::to_string(past) + ", " + std::to_string(past + t) +
                  ") do not fit the latent cache " + cache.kv.str(),
              "allocate the cache (LatentCache::allocate) for this batch and the longest sequence");
  const Variable xv(x);
  const Projections proj = project(xv);
  const Variable qr = wq ? Variable() : q_norm->forward(proj.q);  // [B, T, q_lora_rank]
  const Tensor q = (wq ? query(proj.q, rope, positions) : query_from_latent(qr, rope, positions)).value();  // [B, T, H, d_qk]
  const Variable kv = latent_kv(proj.kv, rope, positions);    // [B, T, 1, d_c + d_r]
  const Tensor c = kv_norm.forward(autograd::narrow_last(kv, 0, dc)).value();  // [B, T, 1, d_c]
  for (int64_t bi = 0; bi < b; ++bi) {
    Tensor kv_rows = cache.kv.select(0, bi).slice(0, past, past + t);        // [T, 1, d_c + d_r]
    Tensor latent_rows = cache.latent.select(0, bi).slice(0, past, past + t);  // [T, 1, d_c]
    const Tensor c_b = c.select(0, bi), kv_b = kv.value().select(0, bi);
    kernels::copy_columns(kv_rows, 0, c_b, 0, dc);
    kernels::copy_columns(kv_rows, dc, kv_b, dc, dr);
    kernels::copy_columns(latent_rows, 0, c_b, 0, dc);
  }
  // wkv_b [H * (d_n + d_v), d_c] viewed per head: rows [0, d_n) map the latent to the nope key
  // (W_UK), rows [d_n, d_n + d_v) to the value (W_UV).
  const Tensor w = wkv_b.weight.var.value().view({h, dn + v_dim_, dc});
  // Absorbed query [B, T, H, d_c + d_r]: q_abs,h = q_n,h W_UK_h, then the rope part as is, so that
  // q_abs,h . c_s + q_r,h . k_r,s equals the standard form's score.
  Tensor qa = Tensor::empty({b, t, h, dc + dr}, DType::f32, MemCategory::activations);
  {
    Tensor qa_lat = qa.view({n, h, dc + dr}).narrow(2, 0, dc).transpose(0, 1);  // [H, N, d_c] strided
    const Tensor q_nope = q.view({n, h, dqk}).narrow(2, 0, dn).transpose(0, 1);  // [H, N, d_n] strided
    kernels::matmul(qa_lat, q_nope, w.narrow(1, 0, dn), false, false);           // @ [H, d_n, d_c]
  }
  kernels::copy_columns(qa, dc, q, dn, dr);
  // MQA over the shared latent rows: key = all d_c + d_r dims, value = the first d_c.
  Tensor o_lat = Tensor::empty({b, t, h, dc}, DType::f32, MemCategory::activations);
  const int64_t context = past + t, topk = dsa.topk > 0 ? dsa.topk : index_topk_;
  Indexer::Outputs ix;
  if (indexer) {
    ix = indexer->forward(xv, qr, rope, positions, dsa.impl);
    for (int64_t bi = 0; bi < b; ++bi) cache.index_k.select(0, bi).slice(0, past, past + t).copy_(ix.k.value().select(0, bi));
  }
  if (indexer && context > topk) {
    // The cached rows [0, context) as the kernels take them: queries are the last T of them.
    const Tensor keys = cache.index_k.slice(1, 0, context).contiguous();                          // [B, L, DI]
    const Tensor rows = cache.kv.slice(1, 0, context).contiguous().view({b, context, dc + dr});  // [B, L, d_c + d_r]
    Tensor idx = Tensor::empty({b, t, topk}, DType::i32, MemCategory::activations);
    kernels::indexer_topk(idx, ix.q.value(), keys, ix.w.value());
    Tensor lse = Tensor::empty({b, t, h}, DType::f32, MemCategory::activations);
    kernels::sparse_mla_forward(o_lat, lse, qa, rows, idx, dc, scale_);
  } else {
    kernels::attention_decode(o_lat, qa, cache.kv, cache.latent, past, scale_);
  }
  // Back to per-head values: o_h = o_lat,h W_UV_h^T.
  Tensor o = Tensor::empty({b, t, h, v_dim_}, DType::f32, MemCategory::activations);
  {
    Tensor o_heads = o.view({n, h, v_dim_}).transpose(0, 1);        // [H, N, d_v]
    const Tensor lat = o_lat.view({n, h, dc}).transpose(0, 1);      // [H, N, d_c]
    kernels::matmul(o_heads, lat, w.narrow(1, dn, v_dim_), false, true);  // @ [H, d_v, d_c]^T
  }
  return wo.forward(Variable(o.view({b, t, h * v_dim_}))).value();
}

}  // namespace titan::models::deepseek_v3
