#include "titan/models/deepseek_v4/model.h"

#include <algorithm>
#include <cstring>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/models/common.h"

namespace titan::models::deepseek_v4 {

namespace {

MoEArgs moe_args(const DeepSeekV4Args& a, int64_t layer) {
  MoEArgs m;
  m.dim = a.dim, m.moe_intermediate_size = a.moe_inter_dim, m.n_routed_experts = a.n_routed_experts;
  m.num_experts_per_tok = a.n_activated_experts, m.routed_scaling_factor = a.route_scale;
  m.swiglu_limit = a.swiglu_limit, m.scoring_func = a.score_func;
  m.routing = a.mlp_types[size_t(layer)] == MlpType::hash_moe ? MoERouting::hash : MoERouting::learned;
  m.vocab_size = a.vocab_size, m.init_std = a.init_std;
  return m;
}

std::unique_ptr<nn::RMSNorm> rms_norm(const DeepSeekV4Args& a) { return std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps); }

}  // namespace

DecoderLayer::DecoderLayer(const DeepSeekV4Args& a, int64_t layer)
    : attn_hc(register_module("attn_hc", std::make_unique<HyperConnection>(a.hyper_connection()))),
      input_layernorm(register_module("input_layernorm", rms_norm(a))),
      self_attn(register_module("self_attn", std::make_unique<Attention>(a, a.layer_types[size_t(layer)]))),
      ffn_hc(register_module("ffn_hc", std::make_unique<HyperConnection>(a.hyper_connection()))),
      post_attention_layernorm(register_module("post_attention_layernorm", rms_norm(a))),
      mlp(register_module("mlp", std::make_unique<MoE>(moe_args(a, layer)))),
      type(a.layer_types[size_t(layer)]) {}

Variable DecoderLayer::forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                               const kernels::RopeTables& rope, AuxLosses* aux) const {
  const HyperConnection::Mixing before_attn = attn_hc.forward(streams);
  const Variable a = self_attn.forward(input_layernorm.forward(before_attn.collapsed), positions, rope, aux);
  const Variable mid = HyperConnection::merge(streams, a, before_attn);
  const HyperConnection::Mixing before_ffn = ffn_hc.forward(mid);
  const Variable f = mlp.forward(post_attention_layernorm.forward(before_ffn.collapsed), token_ids);
  return HyperConnection::merge(mid, f, before_ffn);
}

Variable DecoderLayer::forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                               const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux) {
  nn::UnitScope unit(*this);  // a unit of the parallel plan (outside its checkpoint region)
  if (recompute == Recompute::none) return forward(streams, positions, token_ids, rope, aux);
  // The region returns the layer's streams and its auxiliary losses (as DeepSeek-V3's blocks do).
  auto made = std::make_shared<AuxLosses>();
  auto region = [this, &rope, positions, token_ids, made](const std::vector<Variable>& in) {
    made->clear();
    std::vector<Variable> out{forward(in[0], positions, token_ids, rope, made.get())};
    for (const AuxLoss& x : *made) out.push_back(x.weighted);
    return out;
  };
  std::vector<Variable> out = autograd::checkpoint(region, {streams}, checkpoint_policy(recompute));
  if (aux)
    for (size_t k = 0; k < made->size(); ++k)
      aux->push_back({(*made)[k].name, out[k + 1], (*made)[k].value, (*made)[k].averaged});
  return out[0];
}

Transformer::Transformer(const DeepSeekV4Args& a)
    : embed_tokens(register_module("embed_tokens",
                                   std::make_unique<nn::Embedding>(a.vocab_size, a.dim, nn::Init::normal(0, a.init_std)))),
      layers(register_module("layers", std::make_unique<nn::ModuleList<DecoderLayer>>())),
      hc_head(register_module("hc_head", std::make_unique<HyperHead>(a.hyper_connection()))),
      norm(register_module("norm", rms_norm(a))),
      lm_head(register_module("lm_head", std::make_unique<nn::Linear>(a.dim, a.vocab_size, nn::Init::normal(0, a.init_std)))),
      args_(a),
      rope_main_(kernels::rope_tables(a.rope(LayerType::sliding), a.max_seq_len)),
      rope_compress_(kernels::rope_tables(a.rope(LayerType::hca), a.max_seq_len)) {
  a.validate();
  lm_head.weight.vocabulary = true;  // AdamW's under Muon (optim/param_groups.h), as the embedding
  for (int64_t l = 0; l < a.n_layers; ++l) layers.append(std::make_unique<DecoderLayer>(a, l));
}

void Transformer::set_compute_dtype(DType dtype) {
  TITAN_CHECK(dtype == DType::f32, "deepseek_v4 trains in float32 for now (its mHC and MoE ops are f32)",
              "set training.mixed_precision_param = \"float32\"");
}

void Transformer::set_indexer_loss_coeff(double coeff) {
  for (size_t l = 0; l < layers.size(); ++l) layers[l].self_attn.indexer_loss_coeff = coeff;
}

void Transformer::set_context_parallel(const distributed::ProcessGroup* cp) {
  if (!cp || cp->size() == 1) return;
  cp_ = cp;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].self_attn.cp = cp;
}

Variable Transformer::logits(const Tensor& tokens, const Tensor& positions, AuxLosses* aux) {
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "deepseek_v4: tokens must be i32 [B, S], got " + tokens.str());
  check_rope_positions("deepseek_v4", positions, args_.max_seq_len);
  const int64_t n = tokens.numel(), d = args_.dim, streams = args_.hc_mult;
  const Tensor ids = tokens.contiguous().view({n});
  Variable e;
  {
    nn::UnitScope unit(embed_tokens);
    e = autograd::view(embed_tokens.forward(tokens, DType::f32), {n, 1, d});
  }
  // The embedding copied into every stream: its gradient is the sum over the copies.
  Variable x = autograd::concat(std::vector<Variable>(size_t(streams), e), 1);  // [T, N, d]
  for (size_t l = 0; l < layers.size(); ++l)
    x = layers[l].forward(x, positions, ids, rope_of(layers[l].type), recompute_, aux);
  const Variable y = norm.forward(hc_head.forward(x));
  nn::UnitScope unit(lm_head);
  return lm_head.forward(y);
}

Variable Transformer::forward(const Tensor& tokens) {
  const auto [mine, positions] = local_sequences(tokens);  // this rank's chunks under CP
  return logits(mine, positions, nullptr);
}

StageOutput Transformer::stage_forward(const distributed::pp::StageLayers& stage, const Variable& /*h*/,
                                       const Tensor& tokens, const Tensor& targets) {
  TITAN_CHECK(stage.embedding && stage.head && stage.begin <= 0 && stage.end >= args_.n_layers,
              "deepseek_v4 does not run pipeline parallel yet", "set parallelism.pipeline_parallel_degree = 1");
  AuxLosses aux;
  StageOutput out;
  const auto [mine, positions] = local_sequences(tokens);  // this rank's chunks under CP
  const Variable l = logits(mine, positions, &aux);
  std::tie(out.loss, out.cross_entropy) = sequence_loss(l, tokens, targets);
  add_auxiliary_losses(out, aux);
  return out;
}

std::vector<std::string> Transformer::loss_term_names() const {
  if (std::find(args_.layer_types.begin(), args_.layer_types.end(), LayerType::csa) == args_.layer_types.end()) return {};
  return {"indexer_loss"};
}

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  std::vector<nn::ShardingUnit> units{{"embed_tokens", &embed_tokens, true}};
  for (size_t l = 0; l < layers.size(); ++l) units.push_back({"layers." + std::to_string(layers.index(l)), &layers[l], true});
  units.push_back({"lm_head", &lm_head, false});
  return units;
}

double Transformer::training_flops_per_token(int64_t seq_len) const {
  // TorchTitan's count: 6 per active weight outside the embedding, plus the attention's scores
  // and values against the keys each query sees (its window, and the compressed entries: CSA's
  // top-k, HCA's visible half on average), 6 x 2 D per key and head.
  const DeepSeekV4Args::ParamCount p = args_.parameters();
  double attention = 0;
  for (LayerType t : args_.layer_types) {
    double keys = double(std::min(args_.sliding_window, seq_len));
    if (t == LayerType::csa) keys += double(std::min(args_.index_topk, seq_len / args_.csa_ratio));
    if (t == LayerType::hca) keys += double(seq_len / args_.hca_ratio) / 2;
    attention += 6.0 * double(args_.n_heads) * 2.0 * double(args_.head_dim) * keys;
  }
  return 6.0 * double(p.active - p.embedding) + attention;
}

void Transformer::start_generation(int64_t batch, int64_t max_len) {
  TITAN_CHECK(!cp_, "deepseek_v4: generation runs on one rank, not context parallel",
              "generate from a checkpoint with `titan generate` (any layout's checkpoint loads whole)");
  TITAN_CHECK(max_len <= args_.max_seq_len, "deepseek_v4: generation of " + std::to_string(max_len) +
                                                " tokens exceeds the RoPE tables (" + std::to_string(args_.max_seq_len) + ")",
              "ask for fewer new tokens or a shorter prompt");
  generated_ = Tensor::zeros({batch, max_len}, DType::i32, MemCategory::activations);
  generated_len_ = 0;
}

Tensor Transformer::decode(const Tensor& tokens) {
  TITAN_CHECK(generated_.defined(), "decode() before start_generation()");
  const int64_t b = tokens.size(0), t = tokens.size(1), cap = generated_.size(1);
  TITAN_CHECK(b == generated_.size(0) && generated_len_ + t <= cap,
              "deepseek_v4: generation ran past its " + std::to_string(cap) + " tokens");
  autograd::NoGradGuard no_grad;
  // No key / value cache yet: every step reruns the whole prefix (exact, quadratic in length).
  const Tensor in = tokens.contiguous();
  for (int64_t r = 0; r < b; ++r)
    std::memcpy(generated_.data<int32_t>() + r * cap + generated_len_, in.data<int32_t>() + r * t, size_t(t) * 4);
  generated_len_ += t;
  Tensor prefix = Tensor::empty({b, generated_len_}, DType::i32);
  for (int64_t r = 0; r < b; ++r)
    std::memcpy(prefix.data<int32_t>() + r * generated_len_, generated_.data<int32_t>() + r * cap, size_t(generated_len_) * 4);
  const Tensor all = forward(prefix).value();  // [B n, V]
  Tensor last = Tensor::empty({b, args_.vocab_size}, DType::f32);
  for (int64_t r = 0; r < b; ++r)
    std::memcpy(last.data<float>() + r * args_.vocab_size,
                all.data<float>() + ((r + 1) * generated_len_ - 1) * args_.vocab_size, size_t(args_.vocab_size) * 4);
  return last;
}

}  // namespace titan::models::deepseek_v4
