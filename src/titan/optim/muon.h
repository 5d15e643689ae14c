// Muon (KellerJordan/Muon; torch.optim.Muon, whose arithmetic this follows step for step): each
// matrix's gradient feeds an EMA momentum buffer, the Nesterov mix of the two is orthogonalised by
// a quintic Newton-Schulz iteration, and the parameter takes decoupled weight decay and the
// orthogonalised update at a shape-adjusted learning rate:
//
//   buf  <- lerp(buf, g, 1 - momentum)                 buf = momentum buf + (1 - momentum) g
//   u    <- nesterov ? lerp(g, buf, momentum) : buf
//   O    <- NS(u)                                      (newton_schulz below)
//   p    <- p (1 - lr weight_decay) - adjust(lr, shape) O
//
// adjust: "original" lr sqrt(max(1, rows / cols)); "match_rms_adamw" (Moonlight) lr 0.2 sqrt(max(rows, cols)).
// Parameters are matrices [rows, cols], or stacked experts [E, rows, cols], each expert its own
// matrix. One f32 buffer per parameter (category optimizer_state): half of AdamW's state.
// ../shared/reference/v4.md section 1 has the sources. This is the single-rank optimizer; the
// trainer's parameter groups and the distributed schemes build on it.
#pragma once

#include <array>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "titan/nn/module.h"

namespace titan::optim {

enum class MuonLrAdjust { original, match_rms_adamw };

struct MuonConfig {
  double momentum = 0.95;
  bool nesterov = true;
  double weight_decay = 0.1;
  std::array<double, 3> ns_coefficients{3.4445, -4.775, 2.0315};  // (a, b, c)
  int ns_steps = 5;
  double eps = 1e-7;  // the norm's floor before the iteration
  MuonLrAdjust adjust = MuonLrAdjust::original;
};

// In place, x [rows, cols] f32 contiguous: X = x (its transpose when rows > cols, so that the Gram
// matrix X X^T is the small one), X /= max(||X||_F, eps), then ns_steps times
// X <- a X + (b A + c A A) X with A = X X^T, transposed back. In f32 (torch.optim.Muon casts to
// bf16 first; f32 here is what the golden test can hold to 1e-6).
void newton_schulz(Tensor& x, const MuonConfig& config);

// The learning rate a [rows, cols] matrix takes.
double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonLrAdjust adjust);

class Muon {
 public:
  // Each param's value is a matrix or stacked experts (f32, contiguous); its buffer takes its shape.
  Muon(std::vector<nn::TrainableParam> params, const MuonConfig& config);
  // One update with learning rate lr; the gradients are multiplied by grad_scale first (clipping).
  // Parameters without a gradient this step are skipped.
  void step(float lr, float grad_scale = 1.0f);
  const MuonConfig& config() const { return config_; }
  // The buffers as "<param name>.momentum_buffer".
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source);

 private:
  struct Slot {
    nn::TrainableParam param;
    Tensor buffer;
  };
  void update(Slot& s, float lr, float grad_scale);
  std::vector<Slot> slots_;
  MuonConfig config_;
};

}  // namespace titan::optim
