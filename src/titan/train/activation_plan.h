// What one token costs in activations and in the gradients of activations, per block of each
// model family as models/<model> runs it: the memory planner's (memory_plan.h) activation and
// temporaries terms. Every tensor a block keeps from forward to backward is listed in the .cpp
// with the op that keeps it; the planner's test holds the sums to measured peaks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/models/recompute.h"

namespace titan::train {

// Bytes per token (of the rank's tokens: its context-parallel share) of one block.
struct BlockActivations {
  double held = 0;            // kept for backward without checkpointing
  double kept_full = 0;       // under full checkpointing: the block's input
  double kept_selective = 0;  // under selective: the input and the GEMM / attention outputs
  // A block replayed in backward: its held tensors (selective: and the saved ones) plus what is
  // alive at the replay's peak, over what the mode kept.
  double replay_full = 0, replay_selective = 0;
  double backward = 0;  // temporaries of its backward (activation gradients, kernel scratch)
};

struct ActivationModel {
  std::vector<BlockActivations> blocks;  // by block id (MTP modules after the main blocks)
  double io = 0;          // inputs, targets, positions
  double embedding = 0;   // the embedding's output (when it is not the first block's input)
  double head = 0;        // final norm, logits and the loss's buffers
  double head_backward = 0;  // the loss's backward: the logits' gradient
};

struct ActivationJob {
  std::string model, flavor;
  int64_t vocab = 0, seq_len = 0, topk = 0, mtp_layers = 0;
  int tp = 1, cp = 1;
  bool bf16 = false;           // bf16 mixed precision: activations in bf16
  bool moe_tp_gather = false;  // MoE under TP: TorchTitan's all-gather scheme instead of the fix
};

ActivationModel activation_model(const ActivationJob& job);

// Peak activation bytes per token of a stage holding `blocks` (ids), with or without the
// embedding and the head, under `mode`: every block's kept bytes, then at the peak either the
// head's (end of forward) or one block replayed in backward.
double activation_peak(const ActivationModel& m, const std::vector<int>& blocks, bool embedding, bool head,
                       models::Recompute mode);
// Temporaries' peak bytes per token: the loss's backward or a block's, whichever is larger.
double backward_temporaries(const ActivationModel& m, const std::vector<int>& blocks, bool head,
                            models::Recompute mode);

}  // namespace titan::train
