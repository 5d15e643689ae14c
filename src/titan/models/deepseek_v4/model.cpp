#include "titan/models/deepseek_v4/model.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/distributed/process_group.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/models/common.h"
#include "titan/models/deepseek_v4/mixed_linear.h"
#include "titan/models/deepseek_v4/mtp.h"

namespace titan::models::deepseek_v4 {

namespace {

std::unique_ptr<nn::RMSNorm> rms_norm(const DeepSeekV4Args& a) { return std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps); }

}  // namespace

DecoderLayer::DecoderLayer(const DeepSeekV4Args& a, int64_t layer, const models::moe::MoEArgs& moe)
    : attn_hc(register_module("attn_hc", std::make_unique<HyperConnection>(a.hyper_connection()))),
      input_layernorm(register_module("input_layernorm", rms_norm(a))),
      self_attn(register_module("self_attn", std::make_unique<Attention>(a, a.layer_types[size_t(layer)]))),
      ffn_hc(register_module("ffn_hc", std::make_unique<HyperConnection>(a.hyper_connection()))),
      post_attention_layernorm(register_module("post_attention_layernorm", rms_norm(a))),
      mlp(register_module("mlp", std::make_unique<MoE>(moe_args(a, layer, moe), a.init_std))),
      type(a.layer_types[size_t(layer)]) {}

Variable DecoderLayer::forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                               const kernels::RopeTables& rope, AuxLosses* aux) const {
  const HyperConnection::Mixing before_attn = attn_hc.forward(streams);
  const Variable a = self_attn.forward(input_layernorm.forward(before_attn.collapsed), positions, rope, aux);
  const Variable mid = HyperConnection::merge(streams, a, before_attn);
  const HyperConnection::Mixing before_ffn = ffn_hc.forward(mid);
  // The MoE takes the tokens as [B, S, d] sequences, under TP this rank's piece [T / tp, d] (and
  // every token's id, for hash routing).
  const Variable normed = post_attention_layernorm.forward(before_ffn.collapsed);  // [T, d]
  const Variable sequences =
      mlp.args().tp ? normed : autograd::view(normed, {positions.size(0), positions.size(1), normed.shape()[1]});
  const DType cd = experts_dtype;
  const Variable moe_in = cd == sequences.dtype() ? sequences : autograd::cast(sequences, cd);
  const Variable f = autograd::cast(autograd::view(mlp.forward_with_aux(moe_in, token_ids).y, normed.shape()), normed.dtype());
  return HyperConnection::merge(mid, f, before_ffn);
}

Variable DecoderLayer::forward(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                               const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux) {
  nn::UnitScope unit(*this);  // a unit of the parallel plan (outside its checkpoint region)
  return forward_in_unit(streams, positions, token_ids, rope, recompute, aux);
}

Variable DecoderLayer::forward_in_unit(const Variable& streams, const Tensor& positions, const Tensor& token_ids,
                                       const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux) {
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

Transformer::Transformer(const DeepSeekV4Args& a, const std::vector<distributed::pp::StageLayers>& stages,
                         const models::moe::MoEArgs& groups)
    : embed_tokens(holds(stages, [](const auto& st) { return st.embedding; }) ||
                           (a.num_mtp_layers > 0 && holds(stages, [](const auto& st) { return st.head; }))
                       ? &register_module("embed_tokens", std::make_unique<nn::Embedding>(a.vocab_size, a.dim,
                                                                                          nn::Init::normal(0, a.init_std)))
                       : nullptr),
      layers(register_module("layers", std::make_unique<nn::ModuleList<DecoderLayer>>())),
      args_(a),
      rope_main_(kernels::rope_tables(a.rope(LayerType::sliding), a.max_seq_len)),
      rope_compress_(kernels::rope_tables(a.rope(LayerType::hca), a.max_seq_len)) {
  a.validate();
  // MTP embeds with the main model's table on the last stage: only a V placement (the first and
  // last stages on one rank) gives it that without a second copy.
  TITAN_CHECK(a.num_mtp_layers == 0 || !holds(stages, [](const auto& st) { return st.head; }) ||
                  holds(stages, [](const auto& st) { return st.embedding; }),
              "deepseek_v4: the MTP modules share the embedding table with the first pipeline stage, which this "
              "schedule places on another rank than the last",
              "use a V-shaped schedule (parallelism.pipeline_parallel_schedule = \"DualPipeV\" or \"ZBVZeroBubble\", "
              "which put the first and last stages on one rank), or set model.mtp_layers = 0");
  const int64_t degree = groups.tp ? groups.tp->size() : 1;
  check_tensor_parallel(a, degree);
  models::moe::MoEArgs moe = groups;
  if (degree == 1) moe.tp = nullptr;
  for (int l = 0; l < a.n_layers; ++l)
    if (holds(stages, [l](const auto& st) { return l >= st.begin && l < st.end; }))
      layers.append_as(size_t(l), std::make_unique<DecoderLayer>(a, l, moe));
  if (holds(stages, [](const auto& st) { return st.head; })) {
    hc_head = &register_module("hc_head", std::make_unique<HyperHead>(a.hyper_connection()));
    norm = &register_module("norm", rms_norm(a));
    lm_head = &register_module("lm_head", std::make_unique<nn::Linear>(a.dim, a.vocab_size, nn::Init::normal(0, a.init_std)));
    lm_head->weight.vocabulary = true;  // AdamW's under Muon (optim/param_groups.h), as the embedding
    if (a.num_mtp_layers > 0) mtp = &register_module("mtp", std::make_unique<MultiTokenPrediction>(a, moe));
  }
  tp_ = moe.tp;
  place_tensor_parallel();  // declares the plan; places the parameters under TP
  for (DecoderLayer* l : decoder_layers()) l->self_attn.set_tensor_parallel(tp_);
}

std::vector<DecoderLayer*> Transformer::decoder_layers() {
  std::vector<DecoderLayer*> out;
  for (size_t l = 0; l < layers.size(); ++l) out.push_back(&layers[l]);
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) out.push_back(&(*mtp)[k]);
  return out;
}

void Transformer::set_compute_dtype(DType dtype) {
  // bf16: the GEMM weights get bf16 copies; the streams and the fused kernels stay f32 (mixed_linear.h).
  compute_dtype_ = dtype;
  Module::set_compute_dtype(dtype);
  for (DecoderLayer* l : decoder_layers()) l->experts_dtype = dtype;
}

void Transformer::set_indexer_loss_coeff(double coeff) {
  for (size_t l = 0; l < layers.size(); ++l) layers[l].self_attn.indexer_loss_coeff = coeff;
}

void Transformer::set_context_parallel(const distributed::ProcessGroup* cp) {
  if (!cp || cp->size() == 1) return;
  TITAN_CHECK(!tp_, "deepseek_v4 does not run context parallel and tensor parallel together yet",
              "set parallelism.context_parallel_degree = 1 or tensor_parallel_degree = 1");
  cp_ = cp;
  for (DecoderLayer* l : decoder_layers()) l->self_attn.cp = cp;
}

Variable Transformer::token_embedding(const Tensor& tokens) {
  TITAN_CHECK(embed_tokens != nullptr, "deepseek_v4: this pipeline rank does not hold the embedding");
  const int64_t n = tokens.numel(), d = args_.dim;
  nn::UnitScope unit(*embed_tokens);
  return tp_ ? autograd::view(distributed::embedding_vocab_parallel(tokens, embed_tokens->weight.var, DType::f32, *tp_),
                              {n / tp_->size(), d})  // this rank's sequence piece
             : autograd::view(embed_tokens->forward(tokens, DType::f32), {n, d});
}

Variable Transformer::embed(const Tensor& tokens) {
  const Variable e = token_embedding(tokens);
  // The embedding copied into every stream: its gradient is the sum over the copies.
  return copy_into_streams(e, args_.hc_mult);  // [T, N, d]
}

Variable Transformer::run_layers(Variable streams, const Tensor& positions, const Tensor& ids, int begin, int end,
                                 AuxLosses* aux) {
  for (size_t l = 0; l < layers.size(); ++l)
    if (const auto index = int64_t(layers.index(l)); index >= begin && index < end)
      streams = layers[l].forward(streams, positions, ids, rope_of(layers[l].type), recompute_, aux);
  return streams;
}

Variable Transformer::head(const Variable& streams) {
  TITAN_CHECK(lm_head != nullptr, "deepseek_v4: this pipeline rank does not hold the output head");
  return output(norm->forward(hc_head->forward(streams)));
}

Variable Transformer::output(const Variable& y) {
  TITAN_CHECK(lm_head != nullptr, "deepseek_v4: this pipeline rank does not hold the output head");
  nn::UnitScope unit(*lm_head);
  return mixed_linear(*lm_head, tp_ ? distributed::gather_tokens(y, *tp_) : y);  // under TP [B S, V / tp]
}

Transformer::LocalTokens Transformer::local_tokens(const Tensor& tokens) const {
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "deepseek_v4: tokens must be i32 [B, S], got " + tokens.str());
  LocalTokens out;
  std::tie(out.tokens, out.positions) = local_sequences(tokens);  // this rank's chunks under CP
  check_rope_positions("deepseek_v4", out.positions, args_.max_seq_len);
  out.ids = out.tokens.contiguous().view({out.tokens.numel()});
  return out;
}

Variable Transformer::forward(const Tensor& tokens) {
  const LocalTokens mine = local_tokens(tokens);
  return head(run_layers(embed(mine.tokens), mine.positions, mine.ids, 0, int(args_.n_layers), nullptr));
}

Shape Transformer::stage_activation_shape(int64_t batch, int64_t seq) const {
  return {batch * seq / (cp_ ? cp_->size() : 1) / (tp_ ? tp_->size() : 1), args_.hc_mult, args_.dim};
}

StageOutput Transformer::stage_forward(const distributed::pp::StageLayers& stage, const Variable& h,
                                       const Tensor& tokens, const Tensor& targets) {
  // Every stage reads the token ids (this rank's chunks under CP): the hash-routed MoE layers
  // choose their experts by them.
  const LocalTokens mine = local_tokens(tokens);
  Variable x = stage.embedding ? embed(mine.tokens)
                               : autograd::view(h, stage_activation_shape(tokens.size(0), tokens.size(1)));
  AuxLosses aux;
  x = run_layers(x, mine.positions, mine.ids, stage.begin, stage.end, &aux);
  StageOutput out;
  if (stage.head) {
    if (mtp) mtp->run(*this, x, tokens, mine.positions, targets, aux);  // before the head, as DeepSeek-V3's
    std::tie(out.loss, out.cross_entropy) = sequence_loss(head(x), tokens, targets);
  } else {
    out.hidden = x;
  }
  add_auxiliary_losses(out, aux);
  return out;
}

void Transformer::end_step(const SumOverData& sum_over_data) {
  for (DecoderLayer* l : decoder_layers()) l->mlp.end_step(sum_over_data);
}

StepStats Transformer::step_stats() {
  StepStats stats;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].mlp.append_stats(stats, int(layers.index(l)));
  if (mtp)  // an MTP block is layer n_layers + K
    for (size_t k = 0; k < mtp->size(); ++k) (*mtp)[k].mlp.append_stats(stats, int(args_.n_layers) + int(k));
  return stats;
}

std::vector<std::string> Transformer::loss_term_names() const {
  std::vector<std::string> names;
  if (std::find(args_.layer_types.begin(), args_.layer_types.end(), LayerType::csa) != args_.layer_types.end())
    names.push_back("indexer_loss");
  if (args_.num_mtp_layers > 0) names.push_back("mtp_loss");
  return names;
}

std::vector<nn::ShardingUnit> Transformer::sharding_units() {
  std::vector<nn::ShardingUnit> units;
  if (embed_tokens) units.push_back({"embed_tokens", embed_tokens, true});
  for (size_t l = 0; l < layers.size(); ++l) units.push_back({"layers." + std::to_string(layers.index(l)), &layers[l], true});
  if (mtp)  // in the order the training forward runs them: after the layers, before the head
    for (size_t k = 0; k < mtp->size(); ++k) units.push_back({"mtp." + std::to_string(k), &(*mtp)[k], true});
  if (lm_head) units.push_back({"lm_head", lm_head, false});
  return units;
}

double Transformer::training_flops_per_token(int64_t seq_len) const {
  // TorchTitan's count: 6 per active weight outside the embedding (and MTP's), plus the attention's scores
  // and values against the keys each query sees (its window, and the compressed entries: CSA's
  // top-k, HCA's visible half on average), 6 x 2 D per key and head.
  const DeepSeekV4Args::ParamCount p = args_.parameters();
  double attention = 0;
  for (LayerType t : with_mtp_layers(args_).layer_types) {  // the MTP blocks' (sliding) too
    double keys = double(std::min(args_.sliding_window, seq_len));
    if (t == LayerType::csa) keys += double(std::min(args_.index_topk, seq_len / args_.csa_ratio));
    if (t == LayerType::hca) keys += double(seq_len / args_.hca_ratio) / 2;
    attention += 6.0 * double(args_.n_heads) * 2.0 * double(args_.head_dim) * keys;
  }
  // MTP: its own weights, the shared head once more per module, and h_proj once per stream.
  const double d = double(args_.dim);
  const double mtp_weights =
      double(p.mtp_active) + double(args_.num_mtp_layers) * (double(args_.vocab_size) * d + double(args_.hc_mult - 1) * d * d);
  return 6.0 * (double(p.active - p.embedding) + mtp_weights) + attention;
}

void Transformer::start_generation(int64_t batch, int64_t max_len) {
  TITAN_CHECK(whole() && !cp_ && !tp_, "deepseek_v4: generation runs on one rank, not pipeline, context or tensor parallel",
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
