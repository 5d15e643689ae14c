#include "titan/models/llama3/model.h"

#include <cmath>

namespace titan::models::llama3 {

using nn::Init;

namespace {
constexpr double kInitStd = 0.02;

// TorchTitan's depth init: output projections of layer l get std 0.02 / sqrt(2 (l + 1)).
double out_proj_std(const Llama3Args& a, int layer_id) {
  return a.depth_init ? kInitStd / std::sqrt(2.0 * (layer_id + 1)) : kInitStd / std::sqrt(2.0 * a.n_layers);
}

Tensor default_positions(int64_t batch, int64_t seq) {
  Tensor p = Tensor::empty({batch, seq}, DType::i32, MemCategory::activations);
  int32_t* d = p.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) d[b * seq + s] = int32_t(s);
  return p;
}
}  // namespace

Attention::Attention(const Llama3Args& a, int layer_id)
    : wq(register_module("wq", std::make_unique<nn::Linear>(a.dim, a.n_heads * a.head_dim(), Init::trunc_normal(kInitStd)))),
      wk(register_module("wk", std::make_unique<nn::Linear>(a.dim, a.kv_heads() * a.head_dim(), Init::trunc_normal(kInitStd)))),
      wv(register_module("wv", std::make_unique<nn::Linear>(a.dim, a.kv_heads() * a.head_dim(), Init::trunc_normal(kInitStd)))),
      wo(register_module("wo", std::make_unique<nn::Linear>(a.n_heads * a.head_dim(), a.dim,
                                                            Init::trunc_normal(out_proj_std(a, layer_id))))),
      n_heads_(a.n_heads),
      n_kv_heads_(a.kv_heads()),
      head_dim_(a.head_dim()) {}

Variable Attention::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const {
  const int64_t b = x.shape()[0], s = x.shape()[1];
  // q [B, S, H, Dh]; k, v [B, S, Hkv, Dh]
  Variable q = autograd::view(wq.forward(x), {b, s, n_heads_, head_dim_});
  Variable k = autograd::view(wk.forward(x), {b, s, n_kv_heads_, head_dim_});
  Variable v = autograd::view(wv.forward(x), {b, s, n_kv_heads_, head_dim_});
  // Hugging Face's rotate-half pairing, so HF Llama checkpoints load without permuting wq/wk.
  q = autograd::rope(q, rope, positions, kernels::RopeLayout::rotate_half);
  k = autograd::rope(k, rope, positions, kernels::RopeLayout::rotate_half);
  Variable o = autograd::attention(q, k, v);  // [B, S, H, Dh]
  return wo.forward(autograd::view(o, {b, s, n_heads_ * head_dim_}));
}

FeedForward::FeedForward(int64_t dim, int64_t hidden, double out_std)
    : w1(register_module("w1", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(kInitStd)))),
      w2(register_module("w2", std::make_unique<nn::Linear>(hidden, dim, Init::trunc_normal(out_std)))),
      w3(register_module("w3", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(out_std)))) {}

Variable FeedForward::forward(const Variable& x) const {
  return w2.forward(autograd::swiglu(w1.forward(x), w3.forward(x)));
}

TransformerBlock::TransformerBlock(const Llama3Args& a, int layer_id)
    : attention(register_module("attention", std::make_unique<Attention>(a, layer_id))),
      feed_forward(register_module("feed_forward",
                                   std::make_unique<FeedForward>(a.dim, a.ffn_hidden(), out_proj_std(a, layer_id)))),
      attention_norm(register_module("attention_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      ffn_norm(register_module("ffn_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))) {}

Variable TransformerBlock::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const {
  Variable h = autograd::add(x, attention.forward(attention_norm.forward(x), rope, positions));
  return autograd::add(h, feed_forward.forward(ffn_norm.forward(h)));
}

Transformer::Transformer(const Llama3Args& a)
    : tok_embeddings(register_module("tok_embeddings", std::make_unique<nn::Embedding>(a.vocab_size, a.dim, Init::normal(0, 1)))),
      layers(register_module("layers", std::make_unique<nn::ModuleList<TransformerBlock>>())),
      norm(register_module("norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      args_(a),
      rope_(kernels::rope_tables(a.rope(), a.max_seq_len)) {
  a.validate();
  for (int l = 0; l < a.n_layers; ++l) layers.append(std::make_unique<TransformerBlock>(a, l));
  if (a.tie_embeddings) {
    tok_embeddings.weight.gemm_weight = true;
  } else {
    const double std = 1.0 / std::sqrt(double(a.dim));
    output = &register_module("output", std::make_unique<nn::Linear>(a.dim, a.vocab_size, Init::trunc_normal(std, 3)));
  }
}

void Transformer::set_compute_dtype(DType dtype) {
  compute_dtype_ = dtype;
  Module::set_compute_dtype(dtype);
}

Variable Transformer::forward(const Tensor& tokens) {
  return forward(tokens, default_positions(tokens.size(0), tokens.size(1)));
}

Variable Transformer::forward(const Tensor& tokens, const Tensor& positions) {
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "llama3: tokens must be i32 [B, S], got " + tokens.str());
  const int64_t b = tokens.size(0), s = tokens.size(1);
  int32_t max_pos = 0;
  for (int64_t i = 0; i < positions.numel(); ++i) max_pos = std::max(max_pos, positions.data<int32_t>()[i]);
  TITAN_CHECK(max_pos < rope_.cos.size(0), "llama3: position " + std::to_string(max_pos) +
                                                " is past the RoPE table (" + std::to_string(rope_.cos.size(0)) + ")",
              "raise the model's max_seq_len or lower training.seq_len");
  Variable h = tok_embeddings.forward(tokens, compute_dtype_);  // [B, S, D]
  for (size_t l = 0; l < layers.size(); ++l) {
    const TransformerBlock& block = layers[l];
    if (recompute_ == Recompute::full) {
      h = autograd::checkpoint(
          [&block, this, positions](const std::vector<Variable>& in) {
            return std::vector<Variable>{block.forward(in[0], rope_, positions)};
          },
          {h})[0];
    } else {
      h = block.forward(h, rope_, positions);
    }
  }
  h = autograd::view(norm.forward(h), {b * s, args_.dim});
  if (output) return output->forward(h);
  return autograd::linear(h, tok_embeddings.weight.var, tok_embeddings.weight.compute);
}

}  // namespace titan::models::llama3
