// DeepSeek-V3 multi-token prediction (MTP; the DeepSeek-V3 report, section 2.2). D modules in
// sequence after the main model; module k (1..D) predicts token t_{i+k+1} at position i:
//
//   h'_i^k = eh_proj([enorm(Emb(t_{i+k})); hnorm(h_i^{k-1})])      eh_proj: [2D] -> [D]
//   h_i^k  = block_k(h'_i^k)                                       a full MLA + FFN/MoE block
//   logits = output(norm_k(h_i^k))                                 the SHARED output head
//   L_k    = cross-entropy against t_{i+k+1} over the positions where it exists
//
// h^0 is the main model's last hidden state before its final norm (the representation the head
// reads; hnorm normalizes it), h^k the output of block k before norm_k. Emb is the main model's
// (shared) embedding table. The concat puts the embedding first: the report writes [h; emb], but
// DeepSeek's released eh_proj weights take [enorm(emb); hnorm(h)] (as vLLM and SGLang run them),
// and loading those weights is what the order must serve.
//
// The tokens (models/mtp_targets.h, shared with DeepSeek-V4): for a row of inputs t_0..t_{S-1} and targets t_1..t_S (the trainer's, passed to the
// training forward), module k at position i embeds the input tokens[i + k] (i + k < S) and is scored
// against targets[i + k] (i + k < S); the last k positions of every row have no target (-100),
// and an ignored target (-100) stays ignored. The training loss adds
// mtp_loss_weight / D * sum_k L_k (each L_k an auxiliary loss the forward returns); training logs
// "mtp_loss", the unweighted mean of the L_k.
//
// Under tensor parallelism the modules run on this rank's sequence piece like the main blocks
// (the embedding vocabulary-parallel, eh_proj and the norms replicated with their partial
// gradients summed over TP, the block split as the main ones, loss parallel on the shared head).
// Under context parallelism they run on this rank's chunks: the shifted tokens and targets are
// taken from the whole sequences, then chunked, and each L_k is rescaled as the main loss is.
//
// Names: ours "mtp.K.{enorm,hnorm,eh_proj,block.<block names>,norm}" (K = k - 1) <-> Hugging
// Face's "model.layers.<n_layers + K>.{enorm,hnorm,eh_proj,<layer names>,shared_head.norm}"
// (hf_adapter.h). MTP only trains: generation does not use it (no speculative decoding here).
#pragma once

#include "titan/models/deepseek_v3/model.h"

namespace titan::models::deepseek_v3 {

// One MTP module ("mtp.K"): k = depth + 1, its block is layer n_layers + depth.
class MtpModule : public nn::Module {
 public:
  MtpModule(const DeepSeekV3Args& a, int depth, const MoeFactory& moe, const distributed::ProcessGroup* tp);
  // h_prev and emb (Emb(t_{i+k})), both [B, S, D] or both this rank's [B*S / tp, D] under TP -> h^k
  // in the same layout, before norm.
  Variable forward(const Variable& h_prev, const Variable& emb, const kernels::RopeTables& rope,
                   const Tensor& positions, Recompute recompute, AuxLosses* aux);
  nn::RMSNorm &enorm, &hnorm;
  nn::Linear& eh_proj;  // [D, 2D]
  TransformerBlock& block;
  nn::RMSNorm& norm;  // HF: shared_head.norm
};

// The D modules (registered as "mtp") and the loss of the last forward.
class MultiTokenPrediction : public nn::ModuleList<MtpModule> {
 public:
  MultiTokenPrediction(const DeepSeekV3Args& a, const MoeFactory& moe, const distributed::ProcessGroup* tp);
  // After the main model's blocks: h0 (before the final norm, Transformer::embed's layout), the
  // whole input sequences [B, S], the positions [B, L] the model ran (this rank's chunks under CP,
  // else L = S) and the targets [B*S]. Appends each module's loss L_k, weighted by
  // mtp_loss_weight / D, to aux as "mtp_loss" (the metric: the mean of the L_k), its block's
  // auxiliary losses before it.
  void run(Transformer& model, const Variable& h0, const Tensor& tokens, const Tensor& positions, const Tensor& targets,
           AuxLosses& aux);

 private:
  DeepSeekV3Args args_;
};

}  // namespace titan::models::deepseek_v3
