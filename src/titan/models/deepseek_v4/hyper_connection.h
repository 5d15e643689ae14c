// DeepSeek-V4's manifold-constrained hyper-connections (mHC; ../shared/reference/v4_transformers.md
// section 2, transformers' DeepseekV4HyperConnection / DeepseekV4HyperHead). The residual stream
// is N copies X [T, N, d] (tokens flattened). Around each attention and MoE block a
// HyperConnection reads the unweighted-RMS-normed streams through one projection fn into
//   pre  [T, N]:    the block's input u = sum_j pre_j X_j (collapse),
//   post [T, N]:    how the block's output a spreads over the streams,
//   comb [T, N, N]: the residual mixing, projected to doubly stochastic by Sinkhorn,
// and merge() forms X'_k = post_k a + sum_j comb[j, k] X_j (comb applied transposed). The
// HyperHead collapses the streams once more before the final norm (pre only). All in f32. The
// maps run fused or in their small-op forms ([model] converters: hyper_connection).
#pragma once

#include "titan/autograd/variable.h"
#include "titan/models/converters.h"
#include "titan/nn/module.h"

namespace titan::models::deepseek_v4 {

using autograd::Variable;

struct HyperConnectionArgs {
  int64_t streams = 4;  // hc_mult, N
  int64_t dim = 0;      // hidden_size, d
  int sinkhorn_iters = 20;
  double hc_eps = 1e-6;    // added to pre, inside softmax's output and each Sinkhorn division
  double norm_eps = 1e-6;  // rms_norm_eps of the unweighted norm
  double init_std = 0.02;  // fn's initializer_range; base starts at 0, scale at 1
};

// rows [T, d] copied into each of n streams: [T, n, d] (the gradient is the sum over the copies).
Variable copy_into_streams(const Variable& rows, int64_t n);

class HyperConnection : public nn::Module, public SwitchableOp {
 public:
  explicit HyperConnection(const HyperConnectionArgs& a);
  const char* converter_op() const override { return kConverterHyperConnection; }
  struct Mixing {
    Variable post;       // [T, N]
    Variable comb;       // [T, N, N], rows j (input streams), columns k (output streams)
    Variable collapsed;  // [T, d]: the block's input
    OpForm form = OpForm::fused;  // the form merge() runs in
  };
  Mixing forward(const Variable& streams) const;  // streams [T, N, d]
  // X' [T, N, d] from the streams X the mixing came from and the block's output a [T, d].
  static Variable merge(const Variable& streams, const Variable& block_out, const Mixing& mixing);

  nn::Parameter& fn;     // [(N + 2) N, N d]
  nn::Parameter& base;   // [(N + 2) N]
  nn::Parameter& scale;  // [3]: pre, post, comb

 private:
  HyperConnectionArgs args_;
  Tensor ones_;  // the unweighted norm's constant weight [N d]
};

class HyperHead : public nn::Module, public SwitchableOp {
 public:
  explicit HyperHead(const HyperConnectionArgs& a);
  const char* converter_op() const override { return kConverterHyperConnection; }
  Variable forward(const Variable& streams) const;  // [T, N, d] -> [T, d]

  nn::Parameter& fn;     // hc_fn [N, N d]
  nn::Parameter& base;   // hc_base [N]
  nn::Parameter& scale;  // hc_scale [1]

 private:
  HyperConnectionArgs args_;
  Tensor ones_;  // the unweighted norm's constant weight [N d]
};

}  // namespace titan::models::deepseek_v4
