// The routed experts' grouped GEMMs under a low-precision recipe ([model] converters
// "quantize.grouped_mm.*", docs/precision.md): quantized_linear's recipe (quantized_linear.h)
// applied to each expert on its own. For expert e's rows a_e [n_e, K] of a [R, K] (rows grouped
// by offsets) and its weight w_e [N, K] of w [E, N, K]:
//   forward  c_e  = Q(a_e along K) Q(w_e along K)^T
//   dgrad    da_e = Q(dc_e along N) Q(w_e along N)
//   wgrad    dw_e = Q(dc_e along tokens)^T Q(a_e along tokens)
// Weights: FP8 blockwise in 128 x 128 blocks per expert, MX in 1 x 32 blocks along K (forward)
// and along N (dgrad), each expert's matrix quantized alone (no block spans two experts).
// Activations and gradients: along K or N per row (1 x 128 or 1 x 32, E4M3). For wgrad the
// tiles run along tokens (128 x 1 or 32 x 1) and restart at every tile start the caller gives:
// at least each expert's first row, so no tile mixes two experts' rows; the MoE adds each
// sequence's first row too, so the scales do not depend on how sequences are split over ranks.
// As in quantized_linear: straight-through gradients, and the GEMMs emulated in f32 on the
// dequantized operands (this CPU has no FP8 / FP4 GEMM); operands of another float dtype are
// cast to f32 and the results back.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "titan/autograd/quantized_linear.h"

namespace titan::autograd {

// The quantized forms of stacked expert weights w [E, N, K], recomputed only when the
// parameters epoch moved, into buffers kept from step to step (no steady-state allocation).
class QuantizedExperts {
 public:
  // w: the f32 master (or its gathered copy under FSDP), or the bf16 compute copy.
  void refresh(const Tensor& w, LowPrecision recipe);
  LowPrecision recipe() const { return recipe_; }
  Tensor along_k, along_m;  // [E, N, K] f32: the values the forward and dgrad GEMMs read
  int64_t stored_bytes() const;  // every expert's codes and scales
 private:
  std::vector<QuantizedWeight> experts_;
  LowPrecision recipe_ = LowPrecision::fp8_blockwise;
  uint64_t epoch_ = ~uint64_t(0);
};

// a [R, K] (any float dtype) quantized per row as an activation: the forward operand, which
// backward keeps for wgrad.
QuantizedRows quantize_activation_rows(const Tensor& a, LowPrecision recipe);

// c [R, N] (a's dtype) = per expert segment Q(a) Q(w_e along K)^T, aq from quantize_activation_rows.
void quantized_grouped_forward(Tensor& c, const QuantizedRows& aq, const QuantizedExperts& w,
                               std::span<const int64_t> offsets);

// The two backward GEMMs: da [R, K] (dc's dtype) and dw [E, N, K] f32, each written or added
// (accumulate_*), or skipped when undefined. dc [R, N]; aq the forward operand's quantized form;
// tile_starts: the rows where wgrad's token tiles restart (sorted, containing every offsets[e]).
void quantized_grouped_backward(const Tensor& da, const Tensor& dw, const Tensor& dc, const QuantizedRows& aq,
                                const QuantizedExperts& w, std::span<const int64_t> offsets,
                                std::span<const int64_t> tile_starts, bool accumulate_dw, bool accumulate_da);

// t [R, C] f32 quantized as an activation along its columns (tiles across rows) in tiles that
// restart at each of tile_starts, then dequantized: what the wgrad GEMM sees.
Tensor fake_quantize_token_tiles(const Tensor& t, LowPrecision recipe, std::span<const int64_t> tile_starts);

// The wgrad tile starts: each segment's first row (offsets [E + 1]) and each row whose group
// (row_group [R], e.g. its token's sequence) differs from the previous row's; sorted, unique.
std::vector<int64_t> token_tile_starts(std::span<const int64_t> offsets, std::span<const int64_t> row_group);

}  // namespace titan::autograd
