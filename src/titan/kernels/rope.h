// Rotary position embedding (RoPE): frequency tables (plain, Llama-3 scaled, YaRN) and the
// Tensor-level apply, forward and backward.
//
// Semantics. Head vectors are rotated pair by pair: pair i (which dims form it: RopeLayout) of
// token n turns by angle theta = positions[n] * inv_freq[i], i in [0, R/2), where
//   inv_freq[i] = theta_base^(-2i / R)                                    (before scaling)
// and the tables hold cos[p][i] = m cos(p inv_freq[i]), sin[p][i] = m sin(p inv_freq[i]) with
// m = 1 except under YaRN (rope_table_magnitude). Positions are given per token, so packed
// sequences, offsets (decode, context parallel shards) and per-document restarts all work.
// Backward is rotation by -theta (times m), i.e. the transpose of forward, exactly so even for the
// rounded f32 tables, since both read the same table entries.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/kernels/rope_params.h"

namespace titan::kernels {

enum class RopeScaling : uint8_t {
  none,
  // Meta's Llama 3.1 scaling: wavelengths below original/high_freq_factor keep their frequency,
  // wavelengths above original/low_freq_factor are divided by `factor`, and in between the two
  // are blended linearly in original/wavelength.
  llama3,
  // YaRN as in DeepSeek-V3's reference (inference/model.py, precompute_freqs_cis): dims whose
  // wavelength fits beta_fast rotations into the original context keep their frequency, dims
  // with fewer than beta_slow rotations are divided by `factor`, with a linear ramp between
  // (ramp ends rounded outward: floor / ceil). DeepSeek's reference switches YaRN on only when
  // max_seq_len > original_seq_len; the model config picks `none` otherwise.
  yarn,
};

struct RopeConfig {
  int64_t rope_dims = 64;  // R: rotated dims per head (even)
  double theta = 10000;    // frequency base
  RopeScaling scaling = RopeScaling::none;
  double factor = 1;                                 // context extension factor (llama3, yarn)
  int64_t original_max_position_embeddings = 0;      // the pre-extension context (llama3, yarn)
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  double beta_fast = 32, beta_slow = 1;              // yarn: ramp ends, in rotations
  // yarn magnitudes, as Hugging Face's DeepSeek code: the tables are scaled by
  // yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim), and attention multiplies
  // its softmax scale by yarn_mscale(factor, mscale_all_dim)^2. DeepSeek's configs set both
  // equal (1.0 for V3, 0.707 for V2-Lite), so their tables are unscaled, as in DeepSeek's
  // reference. mscale_all_dim = 0 gives plain YaRN (tables scaled by 0.1 ln(factor) + 1).
  double mscale = 1, mscale_all_dim = 0;
};

// 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1 (YaRN's attention temperature).
double yarn_mscale(double factor, double mscale = 1);
// The m the cos/sin tables are multiplied by (1 unless scaling == yarn).
double rope_table_magnitude(const RopeConfig& c);
// inv_freq[i] for i in [0, R/2), after scaling; computed in double. Throws on invalid configs.
std::vector<double> rope_inv_frequencies(const RopeConfig& c);

struct RopeTables {
  Tensor cos, sin;  // [P, R/2] f32, row p = position p
};
// Tables for positions [0, max_positions), computed in double and rounded once to f32 (angles
// grow to ~1e5 rad, where f32 products would lose 1e-2 of phase).
RopeTables rope_tables(const RopeConfig& c, int64_t max_positions);

// y = RoPE(x): x and y are [..., H, Dh] (same shape and dtype, f32 or bf16, contiguous; y may be
// x); positions are i32 with one entry per token (numel = x.numel() / (H * Dh)), each in
// [0, P). Rotates dims [rope_offset, rope_offset + R) of each head (R from the tables) and copies
// the rest.
void rope_forward(Tensor& y, const Tensor& x, const RopeTables& tables, const Tensor& positions, RopeLayout layout,
                  int64_t rope_offset = 0);
// dx += RoPE^T(dy) (rotation by -theta on the rotated dims, dx += dy on the others); with
// accumulate false dx = RoPE^T(dy) is written (dx need not be initialized).
void rope_backward(Tensor& dx, const Tensor& dy, const RopeTables& tables, const Tensor& positions,
                   RopeLayout layout, int64_t rope_offset = 0, bool accumulate = true);

}  // namespace titan::kernels
