// Llama-3: token embedding, n_layers x (RMSNorm -> GQA attention with RoPE -> residual,
// RMSNorm -> SwiGLU FFN -> residual), final RMSNorm, output projection. Parameter names follow
// TorchTitan ("layers.3.attention.wq.weight"); hf_adapter.h maps them to Hugging Face's.
#pragma once

#include "titan/models/causal_lm.h"
#include "titan/models/converters.h"
#include "titan/models/llama3/args.h"
#include "titan/nn/layers.h"

namespace titan::models::llama3 {

using autograd::Variable;

// A module declares its parameters whole; under tensor parallelism (tp, null: none) the plan
// (parallelize.cpp) then leaves it this rank's heads / FFN columns, and its forward takes and
// returns this rank's sequence piece of the tokens. Local sizes are read from the placed weights.
class Attention : public nn::Module, public AppliesRope {
 public:
  Attention(const Llama3Args& a, int layer_id, const distributed::ProcessGroup* tp);
  // x [N, D] (N = B*S tokens, or this rank's N / tp under TP), positions [B, S] -> [N, D]
  Variable forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const;
  // Inference: appends this step's keys/values to the cache [B, max_len, Hkv, Dh] at `past`.
  Variable decode(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions, Tensor& k_cache,
                  Tensor& v_cache, int64_t past) const;
  nn::Linear &wq, &wk, &wv, &wo;
  // Context parallelism (Transformer::set_context_parallel): x and positions hold this rank's
  // chunks of each sequence, and attention runs as ring attention over this group.
  const distributed::ProcessGroup* cp = nullptr;
  bool async_tp = false;  // Transformer::set_async_tensor_parallel

 private:
  int64_t n_heads() const { return wq.weight.var.shape()[0] / head_dim_; }  // this rank's, as placed
  int64_t n_kv_heads() const { return wk.weight.var.shape()[0] / head_dim_; }
  int64_t head_dim_;
  const distributed::ProcessGroup* tp_;
};

class FeedForward : public nn::Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, double out_std, const distributed::ProcessGroup* tp);
  Variable forward(const Variable& x) const;  // w2(silu(w1 x) * w3 x); x [N, D] as Attention's
  nn::Linear &w1, &w2, &w3;
  bool async_tp = false;  // Transformer::set_async_tensor_parallel

 private:
  const distributed::ProcessGroup* tp_;
};

class TransformerBlock : public nn::Module {
 public:
  TransformerBlock(const Llama3Args& a, int layer_id, const distributed::ProcessGroup* tp);
  Variable forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions) const;
  Variable decode(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions, Tensor& k_cache,
                  Tensor& v_cache, int64_t past) const;
  Attention& attention;
  FeedForward& feed_forward;
  nn::RMSNorm &attention_norm, &ffn_norm;
};

using models::Recompute;

// Throws unless `degree` tensor-parallel ranks split the heads, KV heads, FFN hidden size and
// vocabulary evenly, naming the degrees that would (parallelize.cpp).
void check_tensor_parallel(const Llama3Args& a, int64_t degree);

class Transformer : public CausalLM {
 public:
  // tp: tensor + sequence parallelism over this group (null or one rank: none). stages: the
  // pipeline stages this rank holds (empty: the whole model; CausalLM::stage_forward).
  explicit Transformer(const Llama3Args& a, const distributed::ProcessGroup* tp = nullptr,
                       std::vector<distributed::pp::StageLayers> stages = {});
  // tokens [B, S] i32 -> logits [B*S, V] ([B*S, V / tp] under TP) in the compute dtype.
  // Positions are 0..S-1 per row.
  Variable forward(const Tensor& tokens) override;
  // The same with explicit positions (i32 [B, S]), e.g. for decoding with a cache offset.
  Variable forward(const Tensor& tokens, const Tensor& positions);
  // Context parallelism over `cp` (null or one rank: none; distributed/context_parallel.h):
  // forward(tokens) then runs this rank's chunks of each sequence, with ring attention, and
  // returns their logits, [B * 2 S/2cp, V].
  void set_context_parallel(const distributed::ProcessGroup* cp);
  // Async TP (distributed/async_tensor_parallel.h): each block's token all-gather overlaps its
  // column-parallel projections, and its row-parallel projections' reduce-scatter overlaps their
  // GEMMs. No effect without TP.
  void set_async_tensor_parallel(bool on);

  void set_compute_dtype(DType dtype) override;
  DType compute_dtype() const override { return compute_dtype_; }
  void set_recompute(Recompute r) override { recompute_ = r; }
  std::vector<nn::ShardingUnit> sharding_units() override;  // parallelize.cpp
  double training_flops_per_token(int64_t seq_len) const override { return args_.training_flops_per_token(seq_len); }
  int64_t vocab_size() const override { return args_.vocab_size; }
  int64_t max_seq_len() const override { return args_.max_seq_len; }
  const Llama3Args& args() const { return args_; }
  const kernels::RopeTables& rope_tables() const { return rope_; }
  void start_generation(int64_t batch, int64_t max_len) override;
  Tensor decode(const Tensor& tokens) override;
  StageOutput stage_forward(const distributed::pp::StageLayers& stage, const Variable& h, const Tensor& tokens,
                            const Tensor& targets) override;
  Shape stage_activation_shape(int64_t batch, int64_t seq) const override;

  // Null on a pipeline rank whose stages do not include the first (the embedding) or the last
  // (norm, output); layers holds the stages' blocks.
  nn::Embedding* tok_embeddings = nullptr;
  nn::ModuleList<TransformerBlock>& layers;
  nn::RMSNorm* norm = nullptr;
  nn::Linear* output = nullptr;  // null when the embedding is tied

 private:
  void place_tensor_parallel();  // parallelize.cpp: each parameter's TP placement
  Variable embed(const Tensor& tokens);  // -> the residual stream [B*S, D] ([B*S / tp, D] under TP)
  Variable head(const Variable& h);      // the final norm and output -> logits
  Llama3Args args_;
  std::vector<distributed::pp::StageLayers> stages_;
  kernels::RopeTables rope_;
  DType compute_dtype_ = DType::f32;
  Recompute recompute_ = Recompute::none;
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [B, max_len, Hkv, Dh] f32
  int64_t cache_len_ = 0;
};

}  // namespace titan::models::llama3
