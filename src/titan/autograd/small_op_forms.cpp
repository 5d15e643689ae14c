#include "titan/autograd/small_op_forms.h"

#include <limits>
#include <vector>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/kernels/v4_attention_params.h"

namespace titan::autograd {

namespace {
// For the sorted rows of pos [N, k]: the token (t) and the choice (t k + j) each row holds.
struct SortedRows {
  Tensor token, choice;  // [N k] i32
};
SortedRows sorted_rows(const Tensor& pos) {
  const int64_t m = pos.numel(), k = pos.size(1);
  SortedRows r{Tensor::empty({m}, DType::i32), Tensor::empty({m}, DType::i32)};
  const int32_t* p = pos.data<int32_t>();
  for (int64_t c = 0; c < m; ++c) {
    r.token.data<int32_t>()[p[c]] = int32_t(c / k);
    r.choice.data<int32_t>()[p[c]] = int32_t(c);
  }
  return r;
}
}  // namespace

Variable rmsnorm_small_ops(const Variable& x, const Variable& w, double eps) {
  const Variable xf = cast(x, DType::f32);                                 // [..., D]
  const Variable inv_rms = rsqrt(add_scalar(mean_last(mul(xf, xf)), eps));  // [..., 1]
  return cast(mul(mul(xf, inv_rms), w), x.dtype());
}

Variable rope_small_ops(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
                        kernels::RopeLayout layout, int64_t rope_offset) {
  const Shape& xs = x.shape();
  const int64_t heads = xs[xs.size() - 2], head_dim = xs.back(), tokens = x.value().numel() / (heads * head_dim);
  const int64_t rope_dims = 2 * tables.cos.size(1), half = rope_dims / 2, rest = head_dim - rope_offset - rope_dims;
  TITAN_CHECK(rope_offset >= 0 && rest >= 0 && positions.numel() == tokens,
              "rope: " + x.value().str() + " with " + std::to_string(rope_dims) + " rotated dims at " +
                  std::to_string(rope_offset) + " and " + std::to_string(positions.numel()) + " positions",
              "the rotated dims must fit in a head, with one position per token");
  const Variable h = view(cast(x, DType::f32), {tokens, heads, head_dim});  // [N, H, Dh]
  const Tensor pos = positions.contiguous();
  const Variable cos = index_select(Variable(tables.cos), pos), sin = index_select(Variable(tables.sin), pos);  // [N, R/2]
  Variable rotated;                                                          // [N, H, R]
  const Variable xr = narrow(h, 2, rope_offset, rope_dims);
  if (layout == kernels::RopeLayout::rotate_half) {
    const Variable c = view(cos, {tokens, 1, half}), s = view(sin, {tokens, 1, half});
    const Variable x1 = narrow(xr, 2, 0, half), x2 = narrow(xr, 2, half, half);
    rotated = concat({add(mul(x1, c), mul(x2, s), -1.0), add(mul(x2, c), mul(x1, s))}, 2);
  } else {
    const Variable pairs = view(xr, {tokens, heads, half, 2});
    const Variable c = view(cos, {tokens, 1, half, 1}), s = view(sin, {tokens, 1, half, 1});
    const Variable x1 = narrow(pairs, 3, 0, 1), x2 = narrow(pairs, 3, 1, 1);
    rotated = view(concat({add(mul(x1, c), mul(x2, s), -1.0), add(mul(x2, c), mul(x1, s))}, 3), {tokens, heads, rope_dims});
  }
  std::vector<Variable> parts;
  if (rope_offset > 0) parts.push_back(narrow(h, 2, 0, rope_offset));
  parts.push_back(rotated);
  if (rest > 0) parts.push_back(narrow(h, 2, rope_offset + rope_dims, rest));
  const Variable y = parts.size() == 1 ? rotated : concat(parts, 2);
  return cast(view(y, xs), x.dtype());
}

Variable grouped_matmul_small_ops(const Variable& a, const Variable& w, std::span<const int64_t> offsets) {
  const Variable af = cast(a, DType::f32);  // [M, K]
  const int64_t experts = w.shape()[0], n = w.shape()[1], k = w.shape()[2];
  TITAN_CHECK(int64_t(offsets.size()) == experts + 1 && offsets.back() == a.shape()[0],
              "grouped_matmul: " + std::to_string(offsets.size()) + " offsets ending at " +
                  std::to_string(offsets.back()) + " for " + std::to_string(experts) + " experts and " +
                  a.value().str(),
              "pass experts + 1 offsets from 0 to a's rows");
  std::vector<Variable> rows;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t begin = offsets[size_t(e)], count = offsets[size_t(e) + 1] - begin;
    if (count == 0) continue;
    const Variable w_e = view(narrow(w, 0, e, 1), {n, k});                          // [N, K]
    rows.push_back(matmul(narrow(af, 0, begin, count), w_e, false, /*trans_b=*/true));  // [rows_e, N]
  }
  TITAN_CHECK(!rows.empty(), "grouped_matmul: no rows", "route at least one token");
  return cast(rows.size() == 1 ? rows[0] : concat(rows, 0), a.dtype());
}

Variable moe_permute_small_ops(const Variable& x, const Tensor& pos) {
  return cast(index_select(cast(x, DType::f32), sorted_rows(pos).token), x.dtype());
}

Variable moe_unpermute_small_ops(const Variable& out, const Tensor& pos, const Variable& weights) {
  const SortedRows rows = sorted_rows(pos);
  const Variable w_sorted = index_select(view(weights, {pos.numel(), 1}), rows.choice);  // [N k, 1]
  return cast(index_add(pos.size(0), rows.token, mul(cast(out, DType::f32), w_sorted)), out.dtype());
}

Variable v4_attention_small_ops(const Variable& q, const Variable& kv, const Variable& comp, const Tensor& idx,
                                const Variable& sink, int64_t window, int64_t ratio, double softmax_scale) {
  TITAN_CHECK(kv.shape()[1] == q.shape()[1], "v4_attention small ops: " + kv.shape().str() + " keys for " +
                                                  q.shape().str() + " queries",
              "the small-op form runs whole sequences (Skv = S); context parallelism runs the fused kernel");
  kernels::V4AttentionParams d;
  d.B = q.shape()[0], d.S = q.shape()[1], d.Skv = d.S, d.H = q.shape()[2], d.D = q.shape()[3];
  d.T = comp.shape()[1], d.W = window, d.ratio = ratio, d.K = idx.defined() ? idx.size(2) : 0;
  const int64_t L = d.S + d.T;
  // keep [B, 1, S, S + T]: the window of raw keys, then the visible (HCA) or selected (CSA) entries.
  Tensor keep = Tensor::zeros({d.B, 1, d.S, L}, DType::u8);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.S; ++t) {
      uint8_t* row = keep.data<uint8_t>() + (b * d.S + t) * L;
      for (int64_t j = kernels::v4_window_start(d, t); j <= t; ++j) row[j] = 1;
      if (!idx.defined()) {
        for (int64_t w = 0; w < kernels::v4_visible_entries(d, t); ++w) row[d.S + w] = 1;
        continue;
      }
      for (int64_t i = 0; i < d.K; ++i) {
        const int32_t w = idx.data<int32_t>()[(b * d.S + t) * d.K + i];
        if (kernels::v4_slot_valid(d, w, t)) row[d.S + w] = 1;
      }
    }
  const Variable raw = cast(kv, DType::f32);
  const Variable keys = d.T > 0 ? concat({raw, cast(comp, DType::f32)}, 1) : raw;            // [B, L, D]
  const Variable qh = view(transpose(cast(q, DType::f32), 1, 2), {d.B, d.H * d.S, d.D});       // [B, H S, D]
  const Variable scores = view(scale(matmul(qh, keys, false, true), softmax_scale), {d.B, d.H, d.S, L});
  const Variable masked = masked_fill(scores, keep, -std::numeric_limits<double>::infinity());
  const Variable sinks = mul(Variable(Tensor::full({d.B, d.H, d.S, 1}, 1.0, DType::f32)), view(sink, {d.H, 1, 1}));
  const Variable p = narrow(softmax(concat({masked, sinks}, 3)), 3, 0, L);                    // [B, H, S, L]
  const Variable o = view(matmul(view(p, {d.B, d.H * d.S, L}), keys), {d.B, d.H, d.S, d.D});   // [B, H, S, D]
  return cast(transpose(o, 1, 2), q.dtype());
}

}  // namespace titan::autograd
