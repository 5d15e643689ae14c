#include "titan/models/deepseek_v3/model.h"

#include "titan/autograd/ops.h"
#include "titan/distributed/async_tensor_parallel.h"
#include "titan/distributed/context_parallel.h"
#include "titan/distributed/process_group.h"
#include "titan/distributed/tensor_parallel.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/models/common.h"
#include "titan/models/deepseek_v3/mtp.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <tuple>

namespace titan::models::deepseek_v3 {

using nn::Init;

namespace {
// Without a MoE factory every layer (the MTP blocks too) is dense: record that in the args the
// model reports.
DeepSeekV3Args as_built(DeepSeekV3Args a, const MoeFactory& moe) {
  a.validate();
  if (!moe) a.n_dense_layers = a.n_layers + a.num_mtp_layers;
  return a;
}

int64_t degree(const distributed::ProcessGroup* tp) { return tp ? tp->size() : 1; }

// The vocabulary, once the shapes are checked for the TP degree (the first member built).
int64_t checked_vocab(const DeepSeekV3Args& a, const distributed::ProcessGroup* tp) {
  a.validate();
  check_tensor_parallel(a, degree(tp));
  return a.vocab_size;
}
}  // namespace

FeedForward::FeedForward(int64_t dim, int64_t hidden, double out_std, const distributed::ProcessGroup* tp)
    : w1(register_module("w1", std::make_unique<nn::Linear>(dim, hidden,
                                                            Init::trunc_normal(DeepSeekV3Args::kInitStd)))),
      w2(register_module("w2", std::make_unique<nn::Linear>(hidden, dim, Init::trunc_normal(out_std)))),
      w3(register_module("w3", std::make_unique<nn::Linear>(dim, hidden, Init::trunc_normal(out_std)))),
      tp_(degree(tp) > 1 ? tp : nullptr) {}

Variable FeedForward::forward(const Variable& x, AuxLosses* /*aux: none*/) {
  // Under TP every rank's tokens (gathered, or with async TP while they arrive); w3 is recorded
  // before w1 in every form, so that bf16 gradients sum in one order.
  const std::vector<Variable> up = distributed::column_parallel(x, {&w3, &w1}, tp_, async_tp_);
  return distributed::row_parallel(autograd::swiglu(up[1], up[0]), w2, tp_, async_tp_);
}

TransformerBlock::TransformerBlock(const DeepSeekV3Args& a, int layer_id, const MoeFactory& moe,
                                   const distributed::ProcessGroup* tp)
    : attention(register_module("attention", std::make_unique<Attention>(a, layer_id, tp))),
      ffn(build_ffn(a, layer_id, moe, tp)),
      attention_norm(register_module("attention_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))),
      ffn_norm(register_module("ffn_norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps))) {}

BlockFeedForward& TransformerBlock::build_ffn(const DeepSeekV3Args& a, int layer_id, const MoeFactory& moe,
                                              const distributed::ProcessGroup* tp) {
  if (!a.is_moe_layer(layer_id))
    return register_module("feed_forward",
                           std::make_unique<FeedForward>(a.dim, a.inter_dim, a.out_proj_std(layer_id), tp));
  std::unique_ptr<BlockFeedForward> m = moe(a, layer_id, tp);
  TITAN_CHECK(m != nullptr, "deepseek_v3: the MoE factory returned nothing for layer " + std::to_string(layer_id),
              "the factory must build a module for every layer >= n_dense_layers");
  return register_module("moe", std::move(m));
}

Variable TransformerBlock::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                                   AuxLosses* aux) {
  Variable h = autograd::add(x, attention.forward(attention_norm.forward(x), rope, positions, aux));
  return autograd::add(h, ffn.forward(ffn_norm.forward(h), aux));
}

Variable TransformerBlock::forward(const Variable& x, const kernels::RopeTables& rope, const Tensor& positions,
                                   Recompute recompute, AuxLosses* aux) {
  nn::UnitScope unit(*this);  // each block is a unit of the parallel plan (outside its checkpoint region)
  if (recompute == Recompute::none) return forward(x, rope, positions, aux);
  // The region returns the block's output and its auxiliary losses; `made` keeps what they are
  // (names, values) from the first pass. The recompute in backward fills it again, harmlessly:
  // it is the region's own, shared with the autograd record that outlives this call.
  auto made = std::make_shared<AuxLosses>();
  auto region = [this, &rope, positions, made](const std::vector<Variable>& in) {
    made->clear();
    std::vector<Variable> out{forward(in[0], rope, positions, made.get())};
    for (const AuxLoss& a : *made) out.push_back(a.weighted);
    return out;
  };
  std::vector<Variable> out = autograd::checkpoint(region, {x}, checkpoint_policy(recompute));
  if (aux)
    for (size_t k = 0; k < made->size(); ++k) aux->push_back({(*made)[k].name, out[k + 1], (*made)[k].value, (*made)[k].averaged});
  // DeepSeek-V3.2's warm-up trains only the indexers: the LM loss must not backpropagate
  // (uselessly, through recomputed frozen blocks) into the hidden states.
  return attention.dsa.stage == DsaStage::dense_warmup ? Variable(out[0].value()) : out[0];
}

Tensor TransformerBlock::decode(const Tensor& x, const kernels::RopeTables& rope, const Tensor& positions,
                                LatentCache& cache, int64_t past) {
  const Variable xv(x);
  const Tensor a = attention.forward_absorbed(attention_norm.forward(xv).value(), rope, positions, cache, past);
  Variable h = autograd::add(xv, Variable(a));
  return autograd::add(h, ffn.forward(ffn_norm.forward(h))).value();
}

Transformer::Transformer(const DeepSeekV3Args& a, const MoeFactory& moe, const distributed::ProcessGroup* tp,
                         std::vector<distributed::pp::StageLayers> stages)
    : tok_embeddings(holds(stages, [](const auto& st) { return st.embedding; }) ||
                             (a.num_mtp_layers > 0 && holds(stages, [](const auto& st) { return st.head; }))
                         ? &register_module("tok_embeddings", std::make_unique<nn::Embedding>(checked_vocab(a, tp), a.dim,
                                                                                              Init::normal(0, 1)))
                         : nullptr),
      layers(register_module("layers", std::make_unique<nn::ModuleList<TransformerBlock>>())),
      args_(as_built(a, moe)),
      rope_(kernels::rope_tables(a.rope(), a.max_seq_len)) {
  checked_vocab(a, tp);  // checks the shapes when no embedding was built
  tp_ = degree(tp) > 1 ? tp : nullptr;
  const bool head = holds(stages, [](const auto& st) { return st.head; });
  // MTP embeds with the main model's table: the last stage needs it, which only a V placement
  // (the first and last stages on one rank) gives without a second copy.
  TITAN_CHECK(args_.num_mtp_layers == 0 || !head || holds(stages, [](const auto& st) { return st.embedding; }),
              "deepseek_v3: the MTP modules share the embedding table with the first pipeline stage, which this "
              "schedule places on another rank than the last",
              "use a V-shaped schedule (parallelism.pipeline_parallel_schedule = \"DualPipeV\" or \"ZBVZeroBubble\", "
              "which put the first and last stages on one rank), or set model.mtp_layers = 0");
  for (int l = 0; l < args_.n_layers; ++l)
    if (holds(stages, [l](const auto& st) { return l >= st.begin && l < st.end; }))
      layers.append_as(size_t(l), std::make_unique<TransformerBlock>(args_, l, moe, tp_));
  if (head) {
    norm = &register_module("norm", std::make_unique<nn::RMSNorm>(a.dim, a.norm_eps));
    output = &register_module("output", std::make_unique<nn::Linear>(a.dim, a.vocab_size,
                                                                      Init::trunc_normal(1.0 / std::sqrt(double(a.dim)), 3)));
    output->weight.vocabulary = true;  // AdamW's under Muon (optim/param_groups.h)
    if (args_.num_mtp_layers > 0) mtp = &register_module("mtp", std::make_unique<MultiTokenPrediction>(args_, moe, tp_));
  }
  place_tensor_parallel();  // declares the plan; places the parameters under TP
}


void Transformer::set_recompute(Recompute r) { recompute_ = r; }

void Transformer::set_dsa(DsaStage stage, DsaImpl impl, double indexer_loss_coeff, int64_t topk) {
  TITAN_CHECK(args_.has_indexer(), "set_dsa() on a model without a lightning indexer",
              "DeepSeek Sparse Attention needs the deepseek_v32 model (index_n_heads > 0)");
  TITAN_CHECK(topk >= 0 && indexer_loss_coeff >= 0, "set_dsa(): topk and indexer_loss_coeff must be >= 0");
  for (Attention* at : dsa_attentions()) at->dsa = DsaConfig{stage, impl, indexer_loss_coeff, topk};
  for (auto& [name, p] : named_parameters()) {
    const bool train = stage == DsaStage::sparse || name.find(".attention.indexer.") != std::string::npos;
    p->var.set_requires_grad(train);
    if (!train) p->var.clear_grad();
  }
}

std::vector<Attention*> Transformer::dsa_attentions() {
  std::vector<Attention*> out;
  if (!args_.has_indexer()) return out;
  for (size_t l = 0; l < layers.size(); ++l) out.push_back(&layers[l].attention);
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) out.push_back(&(*mtp)[k].block.attention);
  return out;
}

void Transformer::set_compute_dtype(DType dtype) {
  TITAN_CHECK(dtype != DType::f16, "deepseek_v3: fp16 mixed precision is built for llama3 only",
              "set training.mixed_precision_param = \"bfloat16\" or \"float32\"");
  compute_dtype_ = dtype;
  Module::set_compute_dtype(dtype);
}

Variable Transformer::forward(const Tensor& tokens) {
  const auto [mine, positions] = local_sequences(tokens);
  return run(mine, positions, tokens, nullptr, nullptr);
}

Variable Transformer::forward(const Tensor& tokens, const Tensor& targets, AuxLosses& aux) {
  const auto [mine, positions] = local_sequences(tokens);
  return run(mine, positions, tokens, &targets, &aux);
}

void Transformer::set_async_tensor_parallel(bool on) {
  std::vector<TransformerBlock*> blocks;
  for (size_t l = 0; l < layers.size(); ++l) blocks.push_back(&layers[l]);
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) blocks.push_back(&(*mtp)[k].block);
  for (TransformerBlock* b : blocks) {
    b->attention.async_tp = on;
    b->ffn.set_async_tensor_parallel(on);
  }
}

void Transformer::set_context_parallel(const distributed::ProcessGroup* cp) {
  if (!cp || cp->size() == 1) return;
  TITAN_CHECK(args_.aux_loss_alpha == 0, "model.moe_aux_loss_alpha > 0 with context parallelism: the sequence-wise "
                                         "balance loss needs whole sequences",
              "set model.moe_aux_loss_alpha = 0 (the aux-loss-free bias still balances) or context_parallel_degree = 1");
  TITAN_CHECK(!args_.has_indexer() || dsa_impl_ == DsaImpl::fused,
              "context parallelism runs DeepSeek-V3.2's attention (both DSA stages) with the fused kernels",
              "set model.converters = [\"dsa_fused\"]");
  cp_ = cp;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].attention.cp = cp;
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) (*mtp)[k].block.attention.cp = cp;
}

Variable Transformer::forward(const Tensor& tokens, const Tensor& positions) {
  return run(tokens, positions, tokens, nullptr, nullptr);
}

Variable Transformer::embed(const Tensor& tokens) {
  TITAN_CHECK(tok_embeddings != nullptr, "deepseek_v3: this pipeline rank does not hold the embedding");
  if (!tp_) return tok_embeddings->forward(tokens, compute_dtype_);  // [B, S, D]
  nn::UnitScope unit(*tok_embeddings);
  return distributed::embedding_vocab_parallel(tokens, tok_embeddings->weight.var, compute_dtype_, *tp_);
}

Variable Transformer::head(const Variable& normed) {
  TITAN_CHECK(output != nullptr, "deepseek_v3: this pipeline rank does not hold the output head");
  if (tp_) return output->forward(distributed::gather_tokens(normed, *tp_));  // [B*S, V / tp]
  return output->forward(autograd::view(normed, {normed.value().numel() / args_.dim, args_.dim}));
}

Variable Transformer::run(const Tensor& tokens, const Tensor& positions, const Tensor& whole, const Tensor* targets,
                          AuxLosses* aux) {
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "deepseek_v3: tokens must be i32 [B, S], got " + tokens.str());
  TITAN_CHECK(positions.shape() == tokens.shape() && positions.dtype() == DType::i32,
              "deepseek_v3: positions must be i32 " + tokens.shape().str() + ", got " + positions.str());
  check_rope_positions("deepseek_v3", positions, rope_.cos.size(0));
  Variable h = embed(tokens);  // under TP, this rank's piece [B*S / tp, D] of the flattened tokens
  for (size_t l = 0; l < layers.size(); ++l) h = layers[l].forward(h, rope_, positions, recompute_, aux);
  if (mtp && targets) mtp->run(*this, h, whole, positions, *targets, *aux);
  return head(norm->forward(h));
}

void Transformer::start_generation(int64_t batch, int64_t max_len) {
  TITAN_CHECK(!tp_ && !cp_ && output && tok_embeddings && layers.size() == size_t(args_.n_layers),
              "deepseek_v3: generation runs on one rank, not tensor, context or pipeline parallel",
              "generate from a checkpoint with `titan generate` (any layout's checkpoint loads whole)");
  TITAN_CHECK(max_len <= rope_.cos.size(0), "generation of " + std::to_string(max_len) +
                                                " tokens exceeds the model's RoPE table (" +
                                                std::to_string(rope_.cos.size(0)) + ")",
              "ask for fewer new tokens or a shorter prompt");
  cache_.clear();
  for (size_t l = 0; l < layers.size(); ++l) cache_.push_back(LatentCache::allocate(args_, batch, max_len));
  cache_len_ = 0;
}

Tensor Transformer::decode(const Tensor& tokens) {
  TITAN_CHECK(!cache_.empty(), "decode() before start_generation()");
  TITAN_CHECK(compute_dtype_ == DType::f32, "generation runs in f32", "call set_compute_dtype(DType::f32) first");
  autograd::NoGradGuard no_grad;
  const int64_t b = tokens.size(0), t = tokens.size(1);
  TITAN_CHECK(cache_len_ + t <= cache_[0].kv.size(1), "generation ran past the cache of " +
                                                          std::to_string(cache_[0].kv.size(1)) + " tokens");
  const Tensor positions = default_positions(b, t, cache_len_);
  Tensor h = tok_embeddings->forward(tokens, DType::f32).value();  // [B, T, D]
  for (size_t l = 0; l < layers.size(); ++l) h = layers[l].decode(h, rope_, positions, cache_[l], cache_len_);
  cache_len_ += t;
  // Only each row's last position is needed for the next token.
  const Tensor last = h.select(1, t - 1).contiguous();  // [B, D]
  return output->forward(norm->forward(Variable(last))).value();
}

std::vector<std::string> Transformer::loss_term_names() const {
  std::vector<std::string> names;
  if (args_.aux_loss_alpha > 0) names.push_back("moe_aux_loss");
  if (args_.has_indexer()) names.push_back("indexer_loss");
  if (args_.num_mtp_layers > 0) names.push_back("mtp_loss");
  return names;
}

Shape Transformer::stage_activation_shape(int64_t batch, int64_t seq) const {
  const int64_t local = seq / (cp_ ? cp_->size() : 1);  // this rank's chunks under CP
  if (tp_) return {batch * local / tp_->size(), args_.dim};  // embed's layout
  return {batch, local, args_.dim};
}

StageOutput Transformer::stage_forward(const distributed::pp::StageLayers& stage, const Variable& h_in,
                                       const Tensor& tokens, const Tensor& targets) {
  // Under context parallelism every stage runs this rank's chunks of the sequences (the other
  // ranks of its cp group the rest); the last averages the loss over the group.
  TITAN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "deepseek_v3: tokens must be i32 [B, S], got " + tokens.str());
  Tensor mine, positions;
  std::tie(mine, positions) = local_sequences(tokens);
  check_rope_positions("deepseek_v3", positions, rope_.cos.size(0));
  // DeepSeek-V3.2's warm-up trains only the indexers: no gradient crosses the stages (as none
  // reaches the hidden states of the whole model), the input is a constant.
  const bool frozen = args_.has_indexer() && layers.size() > 0 && layers[0].attention.dsa.stage == DsaStage::dense_warmup;
  Variable h;
  if (stage.embedding) {
    h = embed(mine);
  } else {
    h = frozen ? Variable(h_in.value()) : h_in;
    h = autograd::view(h, stage_activation_shape(tokens.size(0), tokens.size(1)));
  }
  AuxLosses aux;
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t index = int64_t(layers.index(l));
    if (index >= stage.begin && index < stage.end) h = layers[l].forward(h, rope_, positions, recompute_, &aux);
  }
  StageOutput out;
  if (stage.head) {
    if (mtp) mtp->run(*this, h, tokens, positions, targets, aux);
    std::tie(out.loss, out.cross_entropy) = sequence_loss(head(norm->forward(h)), tokens, targets);  // loss parallel under TP
  } else {
    out.hidden = h;
  }
  add_auxiliary_losses(out, aux);
  return out;
}

double Transformer::training_flops_per_token(int64_t seq_len) const {
  if (!args_.has_indexer() || layers.size() == 0) return args_.training_flops_per_token(seq_len);
  const DsaConfig& dsa = layers[0].attention.dsa;
  if (dsa.stage == DsaStage::dense_warmup) return args_.training_flops_per_token(seq_len, seq_len, true);
  const int64_t topk = dsa.topk > 0 ? dsa.topk : args_.index_topk;
  return args_.training_flops_per_token(seq_len, std::min(topk, seq_len), false);
}

void Transformer::set_dsa_schedule(const DsaSchedule& schedule, DsaImpl impl) {
  TITAN_CHECK(args_.has_indexer(), "set_dsa_schedule() on a model without a lightning indexer",
              "DeepSeek Sparse Attention needs the deepseek_v32 model (index_n_heads > 0)");
  dsa_schedule_ = schedule;
  dsa_impl_ = impl;
  scheduled_stage_.reset();
}

std::string Transformer::begin_step(int64_t step) {
  if (!args_.has_indexer()) return {};
  const DsaStage want = step <= dsa_schedule_.warmup_steps ? DsaStage::dense_warmup : DsaStage::sparse;
  if (scheduled_stage_ == want) return {};
  set_dsa(want, dsa_impl_, dsa_schedule_.indexer_loss_coeff, dsa_schedule_.topk);
  scheduled_stage_ = want;
  return std::string("DSA stage: ") + dsa_stage_name(want) + " from step " + std::to_string(step) +
         (dsa_impl_ == DsaImpl::fused ? " (fused kernels)" : " (small ops)");
}

void Transformer::end_step(const SumOverData& sum_over_data) {
  // The dense warm-up trains only the indexers: MoE's balancing bias stays frozen with the rest
  // (the warm-up's token counts then join the first sparse step's update, which uses their signs).
  const bool frozen = args_.has_indexer() && layers.size() > 0 && layers[0].attention.dsa.stage == DsaStage::dense_warmup;
  const auto end = [&](BlockFeedForward& ffn) { frozen ? ffn.end_frozen_step(sum_over_data) : ffn.end_step(sum_over_data); };
  for (size_t l = 0; l < layers.size(); ++l) end(layers[l].ffn);
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) end((*mtp)[k].block.ffn);
}

StepStats Transformer::step_stats() {
  StepStats stats;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].ffn.append_stats(stats, int(layers.index(l)));
  if (mtp)
    for (size_t k = 0; k < mtp->size(); ++k) (*mtp)[k].block.ffn.append_stats(stats, int(args_.n_layers) + int(k));
  return stats;
}

}  // namespace titan::models::deepseek_v3
