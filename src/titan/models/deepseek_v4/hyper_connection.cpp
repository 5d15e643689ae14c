#include "titan/models/deepseek_v4/hyper_connection.h"

#include "titan/autograd/hyper_connection.h"
#include "titan/autograd/ops.h"
#include "titan/autograd/v4_small_op_forms.h"
#include "titan/core/error.h"

namespace titan::models::deepseek_v4 {

namespace {

// The streams [T, N, d] unweighted-RMS-normed over all N d values of a token, projected by fn
// [M, N d]: [T, M].
Variable mixes(const Variable& streams, const nn::Parameter& fn, const Tensor& ones, const HyperConnectionArgs& a) {
  TITAN_CHECK(streams.shape().size() == 3 && streams.shape()[1] == a.streams && streams.shape()[2] == a.dim,
              "mHC: the streams must be [T, " + std::to_string(a.streams) + ", " + std::to_string(a.dim) + "], got " +
                  streams.shape().str());
  const int64_t tokens = streams.shape()[0], width = a.streams * a.dim;
  const Variable flat = autograd::view(streams, {tokens, width});
  // The unweighted norm: a constant weight of ones (no parameter, no gradient).
  return autograd::linear(autograd::rmsnorm(flat, Variable(ones), a.norm_eps), fn.var);
}

// The maps in the form chosen.
Variable weights(OpForm form, const Variable& mix, const nn::Parameter& base, const nn::Parameter& scale, int64_t n,
                 double eps) {
  return form == OpForm::fused ? autograd::hc_weights(mix, base.var, scale.var, n, eps)
                               : autograd::hc_weights_small_ops(mix, base.var, scale.var, n, eps);
}
Variable collapse(OpForm form, const Variable& streams, const Variable& pre) {
  return form == OpForm::fused ? autograd::hc_collapse(streams, pre) : autograd::hc_collapse_small_ops(streams, pre);
}

}  // namespace

Variable copy_into_streams(const Variable& rows, int64_t n) {
  TITAN_CHECK(rows.shape().size() == 2, "mHC: the rows copied into the streams must be [T, d], got " + rows.shape().str());
  const Variable one = autograd::view(rows, {rows.shape()[0], 1, rows.shape()[1]});
  return autograd::concat(std::vector<Variable>(size_t(n), one), 1);
}

HyperConnection::HyperConnection(const HyperConnectionArgs& a)
    : fn(register_parameter("fn", {(a.streams + 2) * a.streams, a.streams * a.dim}, nn::Init::normal(0, a.init_std))),
      base(register_parameter("base", {(a.streams + 2) * a.streams}, nn::Init::zeros(), /*weight_decay=*/false)),
      scale(register_parameter("scale", {3}, nn::Init::ones(), /*weight_decay=*/false)),
      args_(a),
      ones_(Tensor::full({a.streams * a.dim}, 1.0, DType::f32, MemCategory::parameters)) {
  TITAN_CHECK(a.streams >= 1 && a.dim >= 1 && a.sinkhorn_iters >= 1,
              "mHC: hc_mult " + std::to_string(a.streams) + ", hidden_size " + std::to_string(a.dim) +
                  ", hc_sinkhorn_iters " + std::to_string(a.sinkhorn_iters),
              "each must be at least 1");
}

HyperConnection::Mixing HyperConnection::forward(const Variable& streams) const {
  const int64_t n = args_.streams, tokens = streams.shape()[0];
  const Variable w = weights(form, mixes(streams, fn, ones_, args_), base, scale, n, args_.hc_eps);
  const Variable pre = autograd::narrow_last(w, 0, n);
  const Variable comb_logits = autograd::view(autograd::narrow_last(w, 2 * n, n * n), {tokens, n, n});
  const Variable comb = form == OpForm::fused ? autograd::sinkhorn(comb_logits, args_.sinkhorn_iters, args_.hc_eps)
                                              : autograd::sinkhorn_small_ops(comb_logits, args_.sinkhorn_iters, args_.hc_eps);
  return {autograd::narrow_last(w, n, n), comb, collapse(form, streams, pre), form};
}

Variable HyperConnection::merge(const Variable& streams, const Variable& block_out, const Mixing& mixing) {
  return mixing.form == OpForm::fused ? autograd::hc_expand(streams, block_out, mixing.post, mixing.comb)
                                      : autograd::hc_expand_small_ops(streams, block_out, mixing.post, mixing.comb);
}

HyperHead::HyperHead(const HyperConnectionArgs& a)
    : fn(register_parameter("fn", {a.streams, a.streams * a.dim}, nn::Init::normal(0, a.init_std))),
      base(register_parameter("base", {a.streams}, nn::Init::zeros(), /*weight_decay=*/false)),
      scale(register_parameter("scale", {1}, nn::Init::ones(), /*weight_decay=*/false)),
      args_(a),
      ones_(Tensor::full({a.streams * a.dim}, 1.0, DType::f32, MemCategory::parameters)) {}

Variable HyperHead::forward(const Variable& streams) const {
  const Variable pre = weights(form, mixes(streams, fn, ones_, args_), base, scale, args_.streams, args_.hc_eps);
  return collapse(form, streams, pre);
}

}  // namespace titan::models::deepseek_v4
