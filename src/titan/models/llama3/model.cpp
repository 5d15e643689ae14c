#include "titan/models/llama3/model.h"

#include <cmath>
#include <tuple>

#include "titan/distributed/async_tensor_parallel.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/ring_attention.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/attention_decode.h"
#include "titan/models/common.h"

namespace titan::models::llama3 {

using nn::Init;

namespace {
constexpr double kInitStd = 0.02;

// TorchTitan's depth init: output projections of layer l get std 0.02 / sqrt(2 (l + 1)).
double out_proj_std(const Llama3Args& a, int layer_id) {
  return a.depth_init ? kInitStd / std::sqrt(2.0 * (layer_id + 1)) : kInitStd / std::sqrt(2.0 * a.n_layers);
}

int64_t degree(const distributed::ProcessGroup* tp) { return tp ? tp->size() : 1; }

// The vocabulary, once the shapes are checked for the TP degree (the first member built).
int64_t checked_vocab(const Llama3Args& a, const distributed::ProcessGroup* tp) {
  a.validate();
  check_tensor_parallel(a, degree(tp));
  return a.vocab_size;
}

// Under TP, a sublayer's input: every rank's tokens gathered.
Variable all_tokens(const Variable& x, const distributed::ProcessGroup* tp) {
  return tp ? distributed::gather_tokens(x, *tp) : x;
}
}  // namespace

Attention::Attention(const Llama3Args& a, int layer_id, const distributed::ProcessGroup* tp)
    : wq(register_module("wq", std::make_unique<nn::Linear>(a.dim, a.n_heads * a.head_dim(),
                                                            Init::trunc_normal(kInitStd)))),
      wk(register_module("wk", std::make_unique<nn::Linear>(a.dim, a.kv_heads() * a.head_dim(),
                                                            Init::trunc_normal(kInitStd)))),
      wv(register_module("wv", std::make_unique<nn::Linear>(a.dim, a.kv_heads() * a.head_dim(),
                                                            Init::trunc_normal(kInitStd)))),
      wo(register_module("wo", std::make_unique<nn::Linear>(a.n_heads * a.head_dim(), a.dim,
                                                            Init::trunc_normal(out_proj_std(a, layer_id))))),
      head_dim_(a.head_dim()),
      tp_(tp) {}

Variable Attention::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const {
  const int64_t b = positions.size(0), s = positions.size(1);
  // q [B, S, H, Dh]; k, v [B, S, Hkv, Dh] (this rank's heads, every rank's tokens)
  const std::vector<Variable> qkv = distributed::column_parallel(x, {&wq, &wk, &wv}, tp_, async_tp);
  Variable q = autograd::view(qkv[0], {b, s, n_heads(), head_dim_});
  Variable k = autograd::view(qkv[1], {b, s, n_kv_heads(), head_dim_});
  Variable v = autograd::view(qkv[2], {b, s, n_kv_heads(), head_dim_});
  // Hugging Face's rotate-half pairing, so HF Llama checkpoints load without permuting wq/wk.
  q = apply_rope(q, rope, positions, kernels::RopeLayout::rotate_half);
  k = apply_rope(k, rope, positions, kernels::RopeLayout::rotate_half);
  Variable o = cp ? distributed::ring_attention(q, k, v, *cp) : autograd::attention(q, k, v);  // [B, S, H, Dh]
  return distributed::row_parallel(autograd::view(o, {b * s, n_heads() * head_dim_}), wo, tp_, async_tp);
}

Variable Attention::decode(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                          Tensor& k_cache, Tensor& v_cache, int64_t past) const {
  const int64_t b = x.shape()[0], t = x.shape()[1];
  Variable q = autograd::view(wq.forward(x), {b, t, n_heads(), head_dim_});
  Variable k = autograd::view(wk.forward(x), {b, t, n_kv_heads(), head_dim_});
  Variable v = autograd::view(wv.forward(x), {b, t, n_kv_heads(), head_dim_});
  q = apply_rope(q, rope, positions, kernels::RopeLayout::rotate_half);
  k = apply_rope(k, rope, positions, kernels::RopeLayout::rotate_half);
  k_cache.slice(1, past, past + t).copy_(k.value());
  v_cache.slice(1, past, past + t).copy_(v.value());
  Tensor o = Tensor::empty({b, t, n_heads(), head_dim_}, DType::f32, MemCategory::activations);
  kernels::attention_decode(o, q.value(), k_cache, v_cache, past);
  return wo.forward(Variable(o.view({b, t, n_heads() * head_dim_})));
}

FeedForward::FeedForward(int64_t dim, int64_t hidden, double out_std, const distributed::ProcessGroup* tp)
    : w1(register_module("w1", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(kInitStd)))),
      w2(register_module("w2", std::make_unique<nn::Linear>(hidden, dim, Init::trunc_normal(out_std)))),
      w3(register_module("w3", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(out_std)))),
      tp_(tp) {}

Variable FeedForward::forward(const Variable& x) const {
  // w3 before w1: the order the tape has always recorded them in, which fixes the order their
  // input gradients add up in (bf16 results, and the golden tests, depend on it).
  const std::vector<Variable> up = distributed::column_parallel(x, {&w3, &w1}, tp_, async_tp);
  return distributed::row_parallel(autograd::swiglu(up[1], up[0]), w2, tp_, async_tp);
}

TransformerBlock::TransformerBlock(const Llama3Args& a, int layer_id, const distributed::ProcessGroup* tp)
    : attention(register_module("attention", std::make_unique<Attention>(a, layer_id, tp))),
      feed_forward(register_module("feed_forward",
                                   std::make_unique<FeedForward>(a.dim, a.ffn_hidden(), out_proj_std(a, layer_id), tp))),
      attention_norm(register_module("attention_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      ffn_norm(register_module("ffn_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))) {}

Variable TransformerBlock::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const {
  Variable h = autograd::add(x, attention.forward(attention_norm.forward(x), rope, positions));
  return autograd::add(h, feed_forward.forward(ffn_norm.forward(h)));
}

Variable TransformerBlock::decode(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                                  Tensor& k_cache, Tensor& v_cache, int64_t past) const {
  Variable h = autograd::add(x, attention.decode(attention_norm.forward(x), rope, positions, k_cache, v_cache, past));
  return autograd::add(h, feed_forward.forward(ffn_norm.forward(h)));
}

Transformer::Transformer(const Llama3Args& a, const distributed::ProcessGroup* tp,
                         std::vector<distributed::pp::StageLayers> stages)
    : tok_embeddings(holds(stages, [](const auto& st) { return st.embedding; })
                         ? &register_module("tok_embeddings", std::make_unique<nn::Embedding>(checked_vocab(a, tp), a.dim,
                                                                                              Init::normal(0, 1)))
                         : nullptr),
      layers(register_module("layers", std::make_unique<nn::ModuleList<TransformerBlock>>())),
      args_(a),
      stages_(std::move(stages)),
      rope_(kernels::rope_tables(a.rope(), a.max_seq_len)) {
  checked_vocab(a, tp);  // checks the shapes when no embedding was built
  tp_ = degree(tp) > 1 ? tp : nullptr;
  TITAN_CHECK(!a.tie_embeddings || stages_.empty(), "llama3 with tied embeddings (tie_embeddings) cannot be split into "
                                                    "pipeline stages: the first and last stage would share the table",
              "train the flavor untied, or set parallelism.pipeline_parallel_degree = 1");
  for (int l = 0; l < a.n_layers; ++l)
    if (holds(stages_, [l](const auto& st) { return l >= st.begin && l < st.end; }))
      layers.append_as(size_t(l), std::make_unique<TransformerBlock>(a, l, tp_));
  if (holds(stages_, [](const auto& st) { return st.head; })) {
    norm = &register_module("norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps));
    if (a.tie_embeddings) {
      tok_embeddings->weight.gemm_weight = true;
    } else {
      const double std = 1.0 / std::sqrt(double(a.dim));
      output = &register_module("output", std::make_unique<nn::Linear>(a.dim, a.vocab_size,
                                                                        Init::trunc_normal(std, 3)));
      output->weight.vocabulary = true;  // AdamW's under Muon (optim/param_groups.h)
    }
  }
  place_tensor_parallel();  // declares the plan; places the parameters under TP
}

void Transformer::set_compute_dtype(DType dtype) {
  compute_dtype_ = dtype;
  Module::set_compute_dtype(dtype);
}

Variable Transformer::forward(const Tensor& tokens) {
  const auto [mine, positions] = local_sequences(tokens);
  return forward(mine, positions);
}

void Transformer::set_async_tensor_parallel(bool on) {
  for (size_t l = 0; l < layers.size(); ++l) layers[l].attention.async_tp = layers[l].feed_forward.async_tp = on;
}

void Transformer::set_context_parallel(const distributed::ProcessGroup* cp) {
  if (!cp || cp->size() == 1) return;
  cp_ = cp;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].attention.cp = cp;
}

Variable Transformer::embed(const Tensor& tokens) {
  TITAN_CHECK(tok_embeddings != nullptr, "llama3: this pipeline rank does not hold the embedding");
  if (tp_) {
    nn::UnitScope unit(*tok_embeddings);
    return distributed::embedding_vocab_parallel(tokens, tok_embeddings->weight.var, activation_dtype(), *tp_);
  }
  return autograd::view(tok_embeddings->forward(tokens, activation_dtype()), {tokens.numel(), args_.dim});
}

Variable Transformer::head(const Variable& h) {
  TITAN_CHECK(norm != nullptr, "llama3: this pipeline rank does not hold the output head");
  const Variable normed = all_tokens(norm->forward(h), tp_);  // [B*S, D]
  if (output) return output->forward(normed);
  return autograd::linear(normed, tok_embeddings->weight.var, tok_embeddings->weight.compute);
}

Variable Transformer::forward(const Tensor& tokens, const Tensor& positions) {
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "llama3: tokens must be i32 [B, S], got " + tokens.str());
  check_rope_positions("llama3", positions, rope_.cos.size(0));
  // The residual stream: [B*S, D], or this rank's [B*S / tp, D] piece under TP.
  Variable h = embed(tokens);
  h = run_blocks<TransformerBlock>(layers, h, recompute_, [this, positions](TransformerBlock& block, const Variable& x) {
    return block.forward(x, rope_, positions);
  });
  return head(h);
}

StageOutput Transformer::stage_forward(const distributed::pp::StageLayers& stage, const Variable& h_in,
                                       const Tensor& tokens, const Tensor& targets) {
  // Under context parallelism every stage runs this rank's chunks of the sequences (the other
  // ranks of its cp group the rest, by ring attention); the last averages the loss over the group.
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "llama3: tokens must be i32 [B, S], got " + tokens.str());
  Tensor mine, positions;
  std::tie(mine, positions) = local_sequences(tokens);
  check_rope_positions("llama3", positions, rope_.cos.size(0));
  Variable h = stage.embedding ? embed(mine) : h_in;
  h = run_blocks<TransformerBlock>(
      layers, h, recompute_,
      [this, positions](TransformerBlock& block, const Variable& x) { return block.forward(x, rope_, positions); },
      stage.begin, stage.end);
  StageOutput out;
  if (!stage.head) {
    out.hidden = h;
    return out;
  }
  std::tie(out.loss, out.cross_entropy) = sequence_loss(head(h), tokens, targets);
  return out;
}

Shape Transformer::stage_activation_shape(int64_t batch, int64_t seq) const {
  return {batch * seq / (tp_ ? tp_->size() : 1) / (cp_ ? cp_->size() : 1), args_.dim};
}

}  // namespace titan::models::llama3

namespace titan::models::llama3 {

void Transformer::start_generation(int64_t batch, int64_t max_len) {
  TITAN_CHECK(!tp_ && !cp_ && stages_.empty(), "llama3: generation runs on one rank, not tensor, context or pipeline parallel",
              "generate from a checkpoint with `titan generate` (any layout's checkpoint loads whole)");
  TITAN_CHECK(max_len <= rope_.cos.size(0), "generation of " + std::to_string(max_len) +
                                                " tokens exceeds the model's RoPE table (" +
                                                std::to_string(rope_.cos.size(0)) + ")",
              "ask for fewer new tokens or a shorter prompt");
  k_cache_.clear();
  v_cache_.clear();
  for (size_t l = 0; l < layers.size(); ++l) {
    k_cache_.push_back(Tensor::zeros({batch, max_len, args_.kv_heads(), args_.head_dim()}, DType::f32, MemCategory::activations));
    v_cache_.push_back(Tensor::zeros({batch, max_len, args_.kv_heads(), args_.head_dim()}, DType::f32, MemCategory::activations));
  }
  cache_len_ = 0;
}

Tensor Transformer::decode(const Tensor& tokens) {
  TITAN_CHECK(!k_cache_.empty(), "decode() before start_generation()");
  TITAN_CHECK(compute_dtype_ == DType::f32, "generation runs in f32", "call set_compute_dtype(DType::f32) first");
  autograd::NoGradGuard no_grad;
  const int64_t b = tokens.size(0), t = tokens.size(1);
  TITAN_CHECK(cache_len_ + t <= k_cache_[0].size(1), "generation ran past the cache of " +
                                                         std::to_string(k_cache_[0].size(1)) + " tokens");
  Tensor positions = Tensor::empty({b, t}, DType::i32);
  for (int64_t i = 0; i < b * t; ++i) positions.data<int32_t>()[i] = int32_t(cache_len_ + i % t);
  Variable h = tok_embeddings->forward(tokens, DType::f32);
  for (size_t l = 0; l < layers.size(); ++l) h = layers[l].decode(h, rope_, positions, k_cache_[l], v_cache_[l], cache_len_);
  cache_len_ += t;
  // Only each row's last position is needed for the next token.
  Tensor last = h.value().select(1, t - 1).contiguous();  // [B, D]
  Variable hn = norm->forward(Variable(last));
  Variable logits = output ? output->forward(hn) : autograd::linear(hn, tok_embeddings->weight.var);
  return logits.value();
}

}  // namespace titan::models::llama3
