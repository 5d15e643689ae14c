// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_ semantics).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "titan/nn/module.h"

namespace titan::optim {

struct GradNorm {
  double norm = 0;   // global L2 norm of all gradients before clipping
  float scale = 1;   // min(1, max_norm / (norm + 1e-6)): pass to the optimizer as grad_scale
  // When the norm is not finite: the first parameter whose gradient on this rank is not ("" when
  // this rank's are all finite: another rank's shard holds the inf or NaN).
  std::string nonfinite;
};

// Computes the norm in a fixed order (bit-identical across runs and thread counts). The scale is
// not applied here: the fused optimizer step multiplies by it, saving a pass over the gradients.
// max_norm <= 0 disables clipping (scale 1). A non-finite norm throws, naming the first
// parameter whose gradient is not finite.
GradNorm clip_grad_norm(const std::vector<std::pair<std::string, nn::Parameter*>>& params, double max_norm);

// The same over TrainableParams whose gradients may be shards of the global ones: the local sum
// of squares goes through sum_over_shards (the sum over the ranks that split the parameters; the
// identity when every rank holds whole, identical gradients), so every rank gets the global norm.
// Gradients marked tp_duplicate (another tensor-parallel rank holds the same) are left out.
// A non-finite norm does not throw: `nonfinite` names where this rank's gradient is not finite,
// and the caller (the trainer's fault policy) decides.
GradNorm clip_grad_norm(const std::vector<nn::TrainableParam>& params, double max_norm,
                        const std::function<double(double)>& sum_over_shards);

}  // namespace titan::optim
