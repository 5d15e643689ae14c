// Multi-token prediction's token shift and loss accounting (the DeepSeek-V3 report, section 2.2),
// shared by the families with MTP modules (deepseek_v3/mtp.h, deepseek_v4/mtp.h).
//
// For a row of inputs t_0..t_{S-1} and targets t_1..t_S (the trainer's), module k (1..D) at
// position i embeds the input tokens[i + k] (i + k < S) and is scored against targets[i + k]
// (i + k < S): it predicts t_{i+k+1}. The last k positions of every row have no target (-100), and
// an ignored target stays ignored. The training loss adds mtp_loss_weight / D * sum_k L_k; the
// metric "mtp_loss" is the unweighted mean of the L_k.
#pragma once

#include <cstdint>
#include <string>

#include "titan/core/tensor.h"
#include "titan/models/causal_lm.h"

namespace titan::models::mtp {

// Module k's input ids: tokens [B, S] i32 shifted left by k, 0 past the row ([B, S] i32).
Tensor shifted_tokens(const Tensor& tokens, int64_t k);
// Module k's targets: targets [B*S] i32 shifted left by k within each row, -100 past it ([B*S] i32).
Tensor shifted_targets(const Tensor& targets, int64_t batch, int64_t seq, int64_t k);
// Module k's input ids [B, L] and targets [B*L] for this rank's tokens: the whole rows shifted,
// then cut into this rank's two chunks per row under context parallelism (L = S / cp; the tokens
// i + k of a chunk's last positions lie in the next chunk, which every CP rank holds: it reads whole
// rows); else L = S.
struct ModuleBatch {
  Tensor ids, targets;
};
ModuleBatch module_batch(const CausalLM& model, const Tensor& tokens, const Tensor& targets, int64_t k);
// Throws (naming `model`) unless targets are [B*S] i32 for tokens [B, S] and S > depth (the last
// module has a target somewhere).
void check_batch(const std::string& model, const Tensor& targets, int64_t batch, int64_t seq, int64_t depth);
// Module k's loss L_k from its logits over this rank's tokens and its targets (flat, this rank's:
// its chunks under context parallelism, where L_k is rescaled as the main loss is): appended to aux
// as "mtp_loss" weighted by `weight` (mtp_loss_weight / D), its value unweighted.
void add_module_loss(const CausalLM& model, const autograd::Variable& logits, const Tensor& targets, double weight,
                     AuxLosses& aux);

}  // namespace titan::models::mtp
