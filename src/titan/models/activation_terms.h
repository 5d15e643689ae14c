// The bookkeeping a family's activation model (ModelFamily::activations) adds its tensors with:
// each tensor of a block as bytes per token, with whether the block keeps it for backward without
// checkpointing and whether selective checkpointing saves it.
#pragma once

#include "titan/models/family.h"

namespace titan::models {

struct BlockTensors {
  double held = 0, saved = 0, held_or_saved = 0;
  void add(double bytes, bool held_, bool saved_ = false) {
    if (held_) held += bytes;
    if (saved_) saved += bytes;
    if (held_ || saved_) held_or_saved += bytes;
  }
};

// A block from its tensors: `input` its input (what full checkpointing keeps), the replay's extra
// bytes alive at its peak under each mode, and its backward's temporaries.
inline BlockActivations block_activations(const BlockTensors& t, double input, double replay_extra_full,
                                          double replay_extra_selective, double backward) {
  BlockActivations b;
  b.held = t.held;
  b.kept_full = input;
  b.kept_selective = input + t.saved;
  b.replay_full = t.held + replay_extra_full;
  b.replay_selective = t.held_or_saved + replay_extra_selective;
  b.backward = backward;
  return b;
}

}  // namespace titan::models
