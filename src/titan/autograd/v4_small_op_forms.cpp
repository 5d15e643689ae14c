#include "titan/autograd/v4_small_op_forms.h"

#include <limits>
#include <vector>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"

namespace titan::autograd {

namespace {

// x [..., R, C] -> [..., C, R].
Variable swap_last(const Variable& x) {
  const int r = int(x.shape().size());
  return transpose(x, r - 2, r - 1);
}

// Each row of x [..., N, N] divided by its sum + eps.
Variable normalize_rows(const Variable& x, double eps) {
  const double n = double(x.shape().back());
  return mul(x, reciprocal(add_scalar(scale(mean_last(x), n), eps)));
}

Variable constant(const Shape& shape, double value) {
  return Variable(Tensor::full(shape, value, DType::f32, MemCategory::activations));
}

}  // namespace

Variable hc_weights_small_ops(const Variable& mix, const Variable& base, const Variable& scale_, int64_t n, double eps) {
  const int64_t m = mix.shape().back();
  TITAN_CHECK(m == n || m == (n + 2) * n, "hc_weights_small_ops: " + std::to_string(m) + " mixes for " +
                                              std::to_string(n) + " streams");
  Variable out;
  const int groups = m == n ? 1 : 3;
  for (int g = 0; g < groups; ++g) {
    const int64_t start = g == 0 ? 0 : g == 1 ? n : 2 * n, len = g == 2 ? n * n : n;
    Variable z = add_broadcast(mul(narrow_last(mix, start, len), narrow(scale_, 0, g, 1)), narrow(base, 0, start, len));
    if (g == 0) z = add_scalar(sigmoid(z), eps);
    if (g == 1) z = scale(sigmoid(z), 2.0);
    out = g == 0 ? z : concat_last(out, z);
  }
  return out;
}

Variable sinkhorn_small_ops(const Variable& logits, int iters, double eps) {
  Variable p = add_scalar(softmax(logits), eps);
  p = swap_last(normalize_rows(swap_last(p), eps));  // the columns
  for (int i = 1; i < iters; ++i) {
    p = normalize_rows(p, eps);
    p = swap_last(normalize_rows(swap_last(p), eps));
  }
  return p;
}

Variable hc_collapse_small_ops(const Variable& x, const Variable& pre) {
  const int64_t t = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  return view(matmul(view(pre, {t, 1, n}), x), {t, d});
}

Variable hc_expand_small_ops(const Variable& x, const Variable& a, const Variable& post, const Variable& comb) {
  const int64_t t = x.shape()[0], n = x.shape()[1], d = x.shape()[2];
  return add(matmul(view(post, {t, n, 1}), view(a, {t, 1, d})), matmul(comb, x, /*trans_a=*/true));
}

Variable compressor_small_ops(const Variable& kv, const Variable& gate, const Variable& bias, int64_t m,
                              kernels::CompressorKind kind) {
  const int64_t b = kv.shape()[0], s = kv.shape()[1], c = kv.shape()[2], t = s / m;
  const bool csa = kind == kernels::CompressorKind::csa;
  const int64_t d = csa ? c / 2 : c;
  TITAN_CHECK(t >= 1, "compressor_small_ops: " + std::to_string(s) + " tokens hold no window of " + std::to_string(m));
  // Every complete window's tokens: [B, T, m, C]; the logits add the bias of the slot's position.
  const Variable values = view(narrow(kv, 1, 0, t * m), {b, t, m, c});
  const Variable logits = add_broadcast(view(narrow(gate, 1, 0, t * m), {b, t, m, c}), bias);
  Variable slot_values = values, slot_logits = logits;
  if (csa) {
    // Slots 0..m-1: the previous window's first halves (window -1 has no tokens: value 0, logit
    // -inf, weight 0); slots m..2m-1: the window's own second halves.
    auto previous = [&](const Variable& x, double none) {
      const Variable first = narrow(x, 3, 0, d);
      if (t == 1) return constant({b, 1, m, d}, none);
      return concat({constant({b, 1, m, d}, none), narrow(first, 1, 0, t - 1)}, 1);
    };
    slot_values = concat({previous(values, 0), narrow(values, 3, d, d)}, 2);
    slot_logits = concat({previous(logits, -std::numeric_limits<double>::infinity()), narrow(logits, 3, d, d)}, 2);
  }
  const int64_t slots = csa ? 2 * m : m;
  // Softmax over the slots (moved last), the weighted values summed over them.
  const Variable p = softmax(transpose(slot_logits, 2, 3));                // [B, T, D, slots]
  const Variable pooled = mean_last(mul(p, transpose(slot_values, 2, 3)));  // [B, T, D, 1]
  return view(scale(pooled, double(slots)), {b, t, d});
}

}  // namespace titan::autograd
