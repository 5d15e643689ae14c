// What the trainer and its checkpoints need from an optimizer ([optimizer] name): AdamW
// (adamw.h) over every parameter, or Muon for the hidden matrices with AdamW for the rest
// (muon_adamw.h). Its state travels as named tensors, each either a parameter's shape (saved and
// resharded with the parameter's slice: "<param name>.<state>") or a replicated scalar.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::optim {

// [optimizer] swap = "file": the optimizer state of this rank's parameters (or shards) in `file`.
struct Swap {
  std::string file;
  int64_t chunk_bytes = int64_t(64) << 20;  // the state of one chunk; two chunks are resident
};

// The state as a checkpoint save takes it (Optimizer::state_for_save): what lives in memory as
// views of the live tensors, and the swapped part as keys whose values `stream` reads from the
// swap file chunk by chunk, so that a save never holds a copy of them.
struct SavedState {
  // emit(index into streamed, first element, values, count): every element once, each key's in order.
  using Emit = std::function<void(size_t key, int64_t begin, const float* values, int64_t n)>;
  std::vector<std::pair<std::string, Tensor>> in_memory;
  std::vector<std::pair<std::string, Shape>> streamed;  // f32
  std::function<void(const Emit&)> stream;              // null when nothing is streamed
};

// b's keys after a's, one stream visiting a's then b's.
SavedState joined(SavedState a, SavedState b);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update with learning rate `lr` (the schedule's value for this step); the gradients are
  // multiplied by grad_scale first (clipping). Parameters without a gradient are skipped.
  virtual void step(float lr, float grad_scale = 1.0f) = 0;
  // The name [optimizer] name spells ("AdamW", "Muon"), which checkpoints record.
  virtual std::string name() const = 0;
  virtual std::vector<std::pair<std::string, Tensor>> state_dict() const = 0;
  // The names and shapes state_dict() returns, without reading anything.
  virtual std::vector<std::pair<std::string, Shape>> state_shapes() const = 0;
  // Every tensor is checked before anything changes: a bad state leaves the optimizer as it was.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) = 0;
  // The same keys as state_dict(), the swapped ones streamed rather than read back whole. The
  // views and the stream are valid until the next step() or load_state_dict().
  virtual SavedState state_for_save() const = 0;
};

// The parameter a per-parameter state key belongs to ("<param>.exp_avg" -> "<param>"); "" for a
// replicated one (the step counter).
std::string state_key_param(const std::string& key);

}  // namespace titan::optim
