// DeepSeek-V4 multi-token prediction (MTP; ../shared/reference/v4_transformers.md section 5,
// DeepSeek's reference MTPBlock; transformers builds none). D modules after the main layers;
// module k (1..D) at position i predicts token t_{i+k+1} from the streams X^{k-1} [T, N, d]
// (X^0: the main model's final streams, before its hc_head) and the embedding of t_{i+k}:
//
//   X'   = e_proj(enorm(Emb(t_{i+k})))  copied into the N streams  +  h_proj(hnorm(X^{k-1}))
//   X^k  = block_k(X')                  a V4 decoder layer: sliding-window attention only (the
//                                       release's compress ratio 0: no compressor, no indexer),
//                                       its own attn_hc / ffn_hc and a learned-routing MoE
//   logits = lm_head(norm_k(hc_head_k(X^k)))   its own HyperHead and norm, the SHARED output head
//   L_k  = cross-entropy against t_{i+k+1} over the positions where it exists
//
// hnorm is an RMSNorm over d applied to each stream alone, h_proj acts on each stream alone (the
// reference's shapes). Emb is the main model's (shared) embedding table. Module k > 1 reads module
// k - 1's streams X^{k-1} (DeepSeek's releases have one module; chaining the streams is DeepSeek-V3's
// rule, the hidden state before the head, carried over to mHC). The token shift, the targets and
// the loss accounting are DeepSeek-V3's (models/mtp_targets.h): the training loss adds
// mtp_loss_weight / D * sum_k L_k, logged unweighted as "mtp_loss" (the mean of the L_k).
//
// The module is its block (it derives from DecoderLayer, as the reference's MTPBlock derives from
// Block), so its names are a layer's plus its own: "mtp.K.{attn_hc, input_layernorm, self_attn,
// ffn_hc, post_attention_layernorm, mlp}..." and "mtp.K.{e_proj, h_proj, enorm, hnorm, hc_head,
// norm}" (hf_adapter.h maps the release's mtp.K.* names). Its MoE statistics are layer n_layers + K.
// MTP only trains: generation and evaluation do not run it. Each module is a unit of the parallel
// plan (FSDP gathers it while it runs). Under tensor parallelism it runs on this rank's sequence
// piece like the main layers (the shifted embedding vocabulary-parallel, e_proj / h_proj, the norms
// and hc_head replicated with partial gradients, the block split as a layer, loss parallel on the
// shared head); under expert parallelism its MoE divides its experts as the main layers'; under
// context parallelism it runs on this rank's chunks (the shifted tokens and targets taken from the
// whole rows, then chunked; its sliding-window attention borrows as a main layer's; each L_k
// rescaled as the main loss is). Under pipeline parallelism it runs on the last stage, which a V
// placement puts on the rank of the first (the embedding); other placements are refused.
#pragma once

#include "titan/models/deepseek_v4/model.h"

namespace titan::models::deepseek_v4 {

// The arguments with num_mtp_layers more layers, the MTP blocks': sliding-window attention and
// learned routing (layer ids n_layers .. n_layers + D - 1).
DeepSeekV4Args with_mtp_layers(DeepSeekV4Args a);

// One MTP module ("mtp.K", K = depth = k - 1).
class MtpModule : public DecoderLayer {
 public:
  MtpModule(const DeepSeekV4Args& a, int64_t depth, const models::moe::MoEArgs& moe);
  // prev: X^{k-1} [T, N, d]; emb: Emb(t_{i+k}) [T, d]; positions [B, S], ids [T] -> X^k [T, N, d].
  Variable forward(const Variable& prev, const Variable& emb, const Tensor& positions, const Tensor& ids,
                   const kernels::RopeTables& rope, Recompute recompute, AuxLosses* aux);
  // X^k -> norm_k(hc_head_k(X^k)) [T, d], what the shared head reads.
  Variable final_rows(const Variable& streams) const;

  nn::Linear &e_proj, &h_proj;  // [d, d] each
  nn::RMSNorm &enorm, &hnorm;
  HyperHead& hc_head;
  nn::RMSNorm& norm;
};

// The D modules (registered as "mtp").
class MultiTokenPrediction : public nn::ModuleList<MtpModule> {
 public:
  MultiTokenPrediction(const DeepSeekV4Args& a, const models::moe::MoEArgs& moe);
  // After the main layers: streams X^0 [B L, N, d] of this rank's tokens, the whole input
  // sequences [B, S], the positions [B, L] the model ran (this rank's chunks under CP, else L = S)
  // and the targets [B*S]. Appends each module's loss L_k, weighted by mtp_loss_weight / D,
  // to aux as "mtp_loss", its block's auxiliary losses before it.
  void run(Transformer& model, const Variable& streams, const Tensor& tokens, const Tensor& positions,
           const Tensor& targets, AuxLosses& aux);

 private:
  double weight_;  // mtp_loss_weight / D
};

}  // namespace titan::models::deepseek_v4
