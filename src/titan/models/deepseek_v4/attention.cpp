#include "titan/models/deepseek_v4/attention.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "titan/autograd/ops.h"
#include "titan/autograd/v4_small_op_forms.h"
#include "titan/core/error.h"
#include "titan/core/profiler.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/compressor.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/lightning_indexer.h"
#include "titan/models/deepseek_v4/mixed_linear.h"
#include "titan/models/indexer_kl.h"

namespace titan::models::deepseek_v4 {

namespace {

constexpr auto kInterleaved = kernels::RopeLayout::interleaved;

std::unique_ptr<nn::Linear> linear(int64_t in, int64_t out, double std) {
  return std::make_unique<nn::Linear>(in, out, nn::Init::normal(0, std));
}

// A value the indexer reads without sending gradient back into the model.
Variable detached(const Variable& x) { return Variable(x.value()); }

// Positions w m of the entries w = 0 .. T - 1 of each of `batch` sequences, i32 [B, T].
Tensor entry_positions(int64_t batch, int64_t entries, int64_t ratio) {
  Tensor p = Tensor::empty({batch, entries}, DType::i32, MemCategory::activations);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t w = 0; w < entries; ++w) p.data<int32_t>()[b * entries + w] = int32_t(w * ratio);
  return p;
}

// The layout of the compressed entries under context parallelism: entry w of the whole sequence
// pools positions w m .., so chunk g's entries are entry chunk g (L a multiple of m).
distributed::CpLayout entry_layout(const distributed::CpLayout& layout, int64_t ratio) {
  return {layout.degree, layout.rank, layout.seq_len / ratio};
}

}  // namespace

Compressor::Compressor(const DeepSeekV4Args& a, int64_t width, int64_t ratio, bool overlap)
    : kv_proj(register_module("kv_proj", linear(a.dim, overlap ? 2 * width : width, a.init_std))),
      gate_proj(register_module("gate_proj", linear(a.dim, overlap ? 2 * width : width, a.init_std))),
      position_bias(register_parameter("position_bias", {ratio, overlap ? 2 * width : width}, nn::Init::zeros(),
                                       /*weight_decay=*/false)),
      kv_norm(register_module("kv_norm", std::make_unique<nn::RMSNorm>(width, a.norm_eps))),
      width_(width),
      ratio_(ratio),
      rope_dim_(a.rope_dim),
      overlap_(overlap) {
  position_bias.bias_table = true;  // AdamW's under Muon (optim/param_groups.h): V4's static biases
}

Variable Compressor::forward_chunks(const Variable& h, const kernels::RopeTables& rope,
                                   const distributed::ProcessGroup& cp, const distributed::CpLayout& layout) const {
  const int64_t b = h.shape()[0], len = layout.chunk(), d = h.shape()[2], c = overlap_ ? 2 * width_ : width_;
  TITAN_CHECK(h.shape()[1] == layout.local_len() && len % ratio_ == 0,
              "deepseek_v4 compressor: chunks of " + std::to_string(len) +
                  " tokens under context parallelism with ratio " + std::to_string(ratio_),
              "make training.seq_len a multiple of 2 x context_parallel_degree x the compress ratios");
  const Variable flat = autograd::view(h, {b * layout.local_len(), d});
  const Variable kv = autograd::view(mixed_linear(kv_proj, flat), {b, layout.local_len(), c});
  const Variable gate = autograd::view(mixed_linear(gate_proj, flat), {b, layout.local_len(), c});
  // CSA: entry w also pools window w - 1's first halves; a chunk's first one lies in the chunk
  // before it. Those m rows go first, and the entry they alone make is dropped.
  std::array<Variable, 2> kv_before, gate_before;
  if (overlap_) {
    kv_before = distributed::preceding_rows(kv, ratio_, cp, layout);
    gate_before = distributed::preceding_rows(gate, ratio_, cp, layout);
  }
  Variable pooled[2];
  for (int j = 0; j < 2; ++j) {
    Variable kv_j = distributed::narrow_sequence(kv, j * len, len);
    Variable gate_j = distributed::narrow_sequence(gate, j * len, len);
    const bool prepended = kv_before[size_t(j)].defined();
    if (prepended) {
      kv_j = distributed::concat_sequence(kv_before[size_t(j)], kv_j);
      gate_j = distributed::concat_sequence(gate_before[size_t(j)], gate_j);
    }
    pooled[j] = pool(kv_j, gate_j);
    if (prepended) pooled[j] = distributed::narrow_sequence(pooled[j], 1, len / ratio_);
  }
  const Variable both = distributed::concat_sequence(pooled[0], pooled[1]);
  const int64_t t = both.shape()[1];
  // RoPE at each entry's global first position: entry layout's positions times m.
  Tensor positions = distributed::local_positions(b, entry_layout(layout, ratio_));
  for (int64_t i = 0; i < positions.numel(); ++i) positions.data<int32_t>()[i] *= int32_t(ratio_);
  const Variable normed = autograd::view(kv_norm.forward(autograd::view(both, {b * t, width_})), {b, t, 1, width_});
  return autograd::view(autograd::rope(normed, rope, positions, kInterleaved, width_ - rope_dim_), {b, t, width_});
}

Variable Compressor::pool(const Variable& kv, const Variable& gate) const {
  const kernels::CompressorKind kind = overlap_ ? kernels::CompressorKind::csa : kernels::CompressorKind::hca;
  return form == OpForm::fused ? autograd::compressor(kv, gate, position_bias.var, ratio_, kind)
                               : autograd::compressor_small_ops(kv, gate, position_bias.var, ratio_, kind);
}

Variable Compressor::forward(const Variable& h, const kernels::RopeTables& rope) const {
  const int64_t b = h.shape()[0], s = h.shape()[1], d = h.shape()[2], c = overlap_ ? 2 * width_ : width_;
  TITAN_CHECK(s >= ratio_, "deepseek_v4: a sequence of " + std::to_string(s) + " tokens is shorter than the compress ratio " +
                               std::to_string(ratio_),
              "use training.seq_len >= " + std::to_string(ratio_));
  const Variable flat = autograd::view(h, {b * s, d});
  const Variable kv = autograd::view(mixed_linear(kv_proj, flat), {b, s, c});
  const Variable gate = autograd::view(mixed_linear(gate_proj, flat), {b, s, c});
  const Variable pooled = pool(kv, gate);
  const int64_t t = pooled.shape()[1];
  const Variable normed = autograd::view(kv_norm.forward(autograd::view(pooled, {b * t, width_})), {b, t, 1, width_});
  const Variable turned =
      autograd::rope(normed, rope, entry_positions(b, t, ratio_), kInterleaved, width_ - rope_dim_);
  return autograd::view(turned, {b, t, width_});
}

Indexer& Compressor::add_indexer(const DeepSeekV4Args& a) {
  indexer = &register_module("indexer", std::make_unique<Indexer>(a));
  return *indexer;
}

IndexerScorer::IndexerScorer(int64_t dim, int64_t heads, double init_std)
    : weights_proj(register_module("weights_proj", linear(dim, heads, init_std))) {}

Indexer::Indexer(const DeepSeekV4Args& a)
    : Compressor(a, a.index_head_dim, a.csa_ratio, /*overlap=*/true),
      q_b_proj(register_module("q_b_proj", linear(a.q_lora_rank, a.index_n_heads * a.index_head_dim, a.init_std))),
      scorer(register_module("scorer", std::make_unique<IndexerScorer>(a.dim, a.index_n_heads, a.init_std))),
      heads_(a.index_n_heads),
      head_dim_(a.index_head_dim),
      rope_dim_(a.rope_dim),
      topk_(a.index_topk),
      ratio_(a.csa_ratio) {}

Indexer::Selection Indexer::select(const Variable& h, const Variable& qr, const kernels::RopeTables& rope,
                                   const Tensor& positions) const {
  Selection sel = queries(h, qr, rope, positions);
  sel.k = forward(h, rope);
  choose(sel, 0);
  return sel;
}

Indexer::Selection Indexer::queries(const Variable& h, const Variable& qr, const kernels::RopeTables& rope,
                                    const Tensor& positions) const {
  const int64_t b = h.shape()[0], s = h.shape()[1], n = b * s;
  Selection sel;
  const Variable q = autograd::view(mixed_linear(q_b_proj, autograd::view(qr, {n, qr.shape()[2]})), {b, s, heads_, head_dim_});
  sel.q = autograd::rope(q, rope, positions, kInterleaved, head_dim_ - rope_dim_);
  // The score's scales, nI^-1/2 dI^-1/2, ride on the weights (kernels/lightning_indexer.h).
  sel.w = autograd::scale(autograd::view(mixed_linear(scorer.weights_proj, autograd::view(h, {n, h.shape()[2]})), {b, s, heads_}),
                          1.0 / std::sqrt(double(heads_) * double(head_dim_)));
  return sel;
}

void Indexer::choose(Selection& sel, int64_t pos0) const {
  const int64_t slots = std::min(topk_, sel.k.shape()[1]);
  sel.idx = Tensor::empty({sel.q.shape()[0], sel.q.shape()[1], slots}, DType::i32, MemCategory::activations);
  // Its own span: the scoring of every visible entry, the one cost per token that grows with S.
  ProfileScope prof("indexer_topk.fwd");
  kernels::indexer_topk(sel.idx, sel.q.value(), sel.k.value(), sel.w.value(), ratio_, pos0);
}

Attention::Attention(const DeepSeekV4Args& a, LayerType type)
    : q_a_proj(register_module("q_a_proj", linear(a.dim, a.q_lora_rank, a.init_std))),
      q_a_norm(register_module("q_a_norm", std::make_unique<nn::RMSNorm>(a.q_lora_rank, a.norm_eps))),
      q_b_proj(register_module("q_b_proj", linear(a.q_lora_rank, a.n_heads * a.head_dim, a.init_std))),
      kv_proj(register_module("kv_proj", linear(a.dim, a.head_dim, a.init_std))),
      kv_norm(register_module("kv_norm", std::make_unique<nn::RMSNorm>(a.head_dim, a.norm_eps))),
      o_a_proj(register_module("o_a_proj",
                               linear(a.n_heads * a.head_dim / a.o_groups, a.o_groups * a.o_lora_rank, a.init_std))),
      o_b_proj(register_module("o_b_proj", linear(a.o_groups * a.o_lora_rank, a.dim, a.init_std))),
      sinks(register_parameter("sinks", {a.n_heads}, nn::Init::zeros(), /*weight_decay=*/false)),
      type_(type),
      heads_(a.n_heads),
      head_dim_(a.head_dim),
      rope_dim_(a.rope_dim),
      groups_(a.o_groups),
      window_(a.sliding_window),
      ratio_(a.compress_ratio(type)),
      norm_eps_(a.norm_eps),
      ones_head_(Tensor::full({a.head_dim}, 1.0, DType::f32, MemCategory::parameters)) {
  if (type != LayerType::sliding) {
    compressor = &register_module("compressor",
                                  std::make_unique<Compressor>(a, a.head_dim, ratio_, type == LayerType::csa));
    if (type == LayerType::csa) compressor->add_indexer(a);
  }
  o_a_proj.quantizable = false;  // forward() multiplies its groups' slices itself
}

void Attention::set_tensor_parallel(const distributed::ProcessGroup* tp) {
  if (!tp || tp->size() == 1) return;
  tp_ = tp;
  heads_ = sinks.var.shape()[0];  // this rank's heads (the sinks are sharded by head)
  groups_ /= tp->size();          // and output groups (DeepSeekV4Args: tp divides o_groups)
}

Variable Attention::forward(const Variable& piece, const Tensor& positions, const kernels::RopeTables& rope,
                            AuxLosses* aux) const {
  // Under TP every rank's tokens: the query latent, the key = value row, the compressors and the
  // indexer run on all of them (replicated), the queries and the attention on this rank's heads.
  const Variable h = tp_ ? distributed::gather_tokens(piece, *tp_) : piece;
  const int64_t b = positions.size(0), s = positions.size(1), n = b * s;
  const int64_t hd = head_dim_, tail = head_dim_ - rope_dim_;
  const Variable qr = q_a_norm.forward(mixed_linear(q_a_proj, h));  // [N, Rq]
  // Queries: each head unweighted-RMS-normed, then RoPE on its tail.
  Variable q = autograd::rmsnorm(autograd::view(mixed_linear(q_b_proj, qr), {n * heads_, hd}), Variable(ones_head_), norm_eps_);
  q = autograd::rope(autograd::view(q, {b, s, heads_, hd}), rope, positions, kInterleaved, tail);
  // The one key = value head.
  Variable kv = autograd::view(kv_norm.forward(mixed_linear(kv_proj, h)), {b, s, 1, hd});
  kv = autograd::view(autograd::rope(kv, rope, positions, kInterleaved, tail), {b, s, hd});

  Variable o = cp ? attend_chunks(h, qr, q, kv, positions, rope, aux)
                  : attend_whole(h, qr, q, kv, positions, rope, aux);
  // Values carry RoPE: turn the output's tail back to the query's frame.
  o = autograd::view(autograd::rope_inverse(o, rope, positions, kInterleaved, tail), {n, heads_ * hd});
  // Grouped low-rank output projection: group g's contiguous heads through rows g Ro.. of o_a_proj
  // (a view: under bf16 FSDP only the weight's bf16 copy is gathered, its f32 rows are not there).
  const int64_t width = heads_ * hd / groups_, rank = o_a_proj.weight.var.shape()[0] / groups_;
  std::vector<Variable> parts;
  parts.reserve(size_t(groups_));
  for (int64_t g = 0; g < groups_; ++g)
    parts.push_back(mixed_linear(autograd::narrow_last(o, g * width, width), autograd::narrow_rows_view(o_a_proj.weight.var, g * rank, rank),
                                 o_a_proj.weight.compute.defined() ? o_a_proj.weight.compute.narrow(0, g * rank, rank) : Tensor()));
  const Variable out = mixed_linear(o_b_proj, groups_ == 1 ? parts[0] : autograd::concat(parts, 1));
  return tp_ ? distributed::reduce_scatter_tokens(out, *tp_) : out;  // this rank's groups' partial sums
}

Variable Attention::attend(const Variable& q, const Keys& keys, AuxLosses* aux, double kl_share) const {
  // Not on grad mode: a checkpointed layer's first pass runs without it, and its recompute must
  // return the same outputs.
  const bool train_indexer = keys.sel.idx.defined() && indexer_loss_coeff > 0 && aux;
  const bool compressed = keys.entries.shape()[1] > 0;
  Tensor head_mean;
  const Variable o = autograd::v4_attention(q, keys.kv, keys.entries, keys.sel.idx, sinks.var, window_,
                                            compressed ? ratio_ : 2, 1.0 / std::sqrt(double(head_dim_)),
                                            train_indexer ? &head_mean : nullptr, keys.pos0);
  if (train_indexer) {
    if (tp_) {  // each rank has the mean over its heads; the target is the mean over all of them
      tp_->all_reduce(head_mean).wait();
      kernels::scale(head_mean, head_mean, 1.0 / double(tp_->size()));
    }
    IndexerTarget target;
    target.idx = keys.sel.idx, target.head_mean = head_mean, target.ratio = ratio_, target.pos0 = keys.pos0;
    const Variable kl = indexer_kl(keys.sel.q, keys.sel.k, keys.sel.w, target);
    aux->push_back({"indexer_loss", autograd::scale(kl, indexer_loss_coeff * kl_share), kl.value().item(), true});
  }
  return o;
}

Variable Attention::attend_whole(const Variable& h, const Variable& qr, const Variable& q, const Variable& kv,
                                 const Tensor& positions, const kernels::RopeTables& rope, AuxLosses* aux) const {
  const int64_t b = positions.size(0), s = positions.size(1), d = h.shape()[1];
  // A sequence shorter than the ratio has no complete window yet (generation's first tokens):
  // its queries see the sliding window alone, as transformers' do.
  Keys keys;
  keys.kv = kv;
  keys.entries = Variable(Tensor::empty({b, 0, head_dim_}, DType::f32, MemCategory::activations));
  if (compressor && s >= ratio_) {
    const Variable hs = autograd::view(h, {b, s, d});
    keys.entries = compressor->forward(hs, rope);
    if (compressor->indexer)
      keys.sel = compressor->indexer->select(detached(hs), detached(autograd::view(qr, {b, s, qr.shape()[1]})), rope,
                                             positions);
  }
  return attend(q, keys, aux, 1.0);
}

Variable Attention::attend_chunks(const Variable& h, const Variable& qr, const Variable& q, const Variable& kv,
                                  const Tensor& positions, const kernels::RopeTables& rope, AuxLosses* aux) const {
  const int64_t b = positions.size(0), s = positions.size(1), d = h.shape()[1];
  const distributed::CpLayout layout{cp->size(), cp->rank(), s * cp->size()};
  const int64_t len = layout.chunk();
  TITAN_CHECK(len >= window_ - 1 && (!compressor || len % ratio_ == 0),
              "deepseek_v4: context-parallel chunks of " + std::to_string(len) + " tokens, window " +
                  std::to_string(window_) + ", compress ratio " + std::to_string(ratio_),
              "each chunk (training.seq_len / 2 context_parallel_degree) must hold the window's W - 1 tokens and "
              "whole compressed windows (DeepSeekV4Args::validate_context_parallel names the values that work)");
  // The window's raw key rows from before each chunk.
  const std::array<Variable, 2> kv_before =
      window_ > 1 ? distributed::preceding_rows(kv, window_ - 1, *cp, layout) : std::array<Variable, 2>{};
  // Every rank's compressed entries (and CSA's indexer keys, its queries and weights local).
  Variable entries = Variable(Tensor::empty({b, 0, head_dim_}, DType::f32, MemCategory::activations));
  Indexer::Selection local;
  const Variable hs = autograd::view(h, {b, s, d});
  if (compressor) {
    const distributed::CpLayout entry = entry_layout(layout, ratio_);
    entries = distributed::gather_sequence(compressor->forward_chunks(hs, rope, *cp, layout), *cp, entry);
    if (compressor->indexer) {
      const Indexer& indexer = *compressor->indexer;
      local = indexer.queries(detached(hs), detached(autograd::view(qr, {b, s, qr.shape()[1]})), rope, positions);
      local.k = distributed::gather_sequence(indexer.forward_chunks(detached(hs), rope, *cp, layout), *cp, entry);
    }
  }
  Variable o[2];
  for (int j = 0; j < 2; ++j) {
    // Chunk j's queries see the raw rows before them and the entries up to their chunk's end.
    Keys keys;
    keys.pos0 = layout.chunk_start(j);
    keys.kv = distributed::narrow_sequence(kv, j * len, len);
    if (kv_before[size_t(j)].defined()) keys.kv = distributed::concat_sequence(kv_before[size_t(j)], keys.kv);
    const int64_t visible = compressor ? (keys.pos0 + len) / ratio_ : 0;
    keys.entries = distributed::narrow_sequence(entries, 0, visible);
    if (local.q.defined()) {
      keys.sel.q = distributed::narrow_sequence(local.q, j * len, len);
      keys.sel.w = distributed::narrow_sequence(local.w, j * len, len);
      keys.sel.k = distributed::narrow_sequence(local.k, 0, visible);
      compressor->indexer->choose(keys.sel, keys.pos0);
    }
    // The KL of each chunk is its rows' mean: 1 / 2c of the whole sequences' rows.
    o[j] = attend(distributed::narrow_sequence(q, j * len, len), keys, aux, 1.0 / double(2 * layout.degree));
  }
  return distributed::concat_sequence(o[0], o[1]);
}

}  // namespace titan::models::deepseek_v4
