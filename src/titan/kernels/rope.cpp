#include "titan/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "titan/kernels/cpu/rope.h"
#include "titan/kernels/ref/rope.h"
#include "titan/kernels/tensor_checks.h"

namespace titan::kernels {

double yarn_mscale(double factor, double mscale) { return factor <= 1 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

double rope_table_magnitude(const RopeConfig& c) {
  if (c.scaling != RopeScaling::yarn) return 1.0;
  return yarn_mscale(c.factor, c.mscale) / yarn_mscale(c.factor, c.mscale_all_dim);
}

namespace {

void validate(const RopeConfig& c) {
  TITAN_CHECK(c.rope_dims > 0 && c.rope_dims % 2 == 0, "rope: rope_dims must be positive and even, got " + std::to_string(c.rope_dims),
              "RoPE rotates pairs of dims; check qk_rope_head_dim / head_dim in the model config");
  TITAN_CHECK(c.theta > 1, "rope: theta must be > 1, got " + std::to_string(c.theta), "typical values are 10000 or 500000");
  if (c.scaling == RopeScaling::none) return;
  TITAN_CHECK(c.factor >= 1, "rope: scaling factor must be >= 1, got " + std::to_string(c.factor),
              "set scaling = none when the context is not extended");
  TITAN_CHECK(c.original_max_position_embeddings > 0, "rope: original_max_position_embeddings must be set for scaled RoPE",
              "it is the pre-extension context, e.g. 4096 for DeepSeek-V3, 8192 for Llama 3.1");
  if (c.scaling == RopeScaling::llama3) {
    TITAN_CHECK(c.high_freq_factor > c.low_freq_factor && c.low_freq_factor > 0,
                "rope: llama3 scaling needs high_freq_factor > low_freq_factor > 0, got " +
                    std::to_string(c.high_freq_factor) + " and " + std::to_string(c.low_freq_factor),
                "Llama 3.1 uses low_freq_factor 1, high_freq_factor 4");
  } else {
    TITAN_CHECK(c.beta_fast > c.beta_slow && c.beta_slow > 0,
                "rope: yarn needs beta_fast > beta_slow > 0, got " + std::to_string(c.beta_fast) + " and " +
                    std::to_string(c.beta_slow),
                "DeepSeek-V3 uses beta_fast 32, beta_slow 1");
  }
}

// The (fractional) dim index whose wavelength fits `rotations` turns into the original context.
double yarn_correction_dim(const RopeConfig& c, double rotations) {
  const double orig = double(c.original_max_position_embeddings);
  return double(c.rope_dims) * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(c.theta));
}

}  // namespace

std::vector<double> rope_inv_frequencies(const RopeConfig& c) {
  validate(c);
  const int64_t half = c.rope_dims / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[size_t(i)] = std::pow(c.theta, -double(2 * i) / double(c.rope_dims));
  if (c.scaling == RopeScaling::llama3) {
    const double orig = double(c.original_max_position_embeddings);
    const double low_wavelen = orig / c.low_freq_factor, high_wavelen = orig / c.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2 * std::numbers::pi / v;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        v /= c.factor;
        continue;
      }
      const double smooth = (orig / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
      v = (1 - smooth) * v / c.factor + smooth * v;
    }
  } else if (c.scaling == RopeScaling::yarn) {
    // Ramp ends clamped to [0, R - 1] (R, not R/2, as in DeepSeek's reference; the ramp is
    // evaluated on pair indices, so an end past R/2 - 1 just means "never fully interpolated").
    const double low = std::max(std::floor(yarn_correction_dim(c, c.beta_fast)), 0.0);
    double high = std::min(std::ceil(yarn_correction_dim(c, c.beta_slow)), double(c.rope_dims - 1));
    if (high == low) high += 0.001;  // avoids 0/0 in the ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      // ramp 0: extrapolate (keep the frequency); ramp 1: interpolate (divide by factor).
      double& v = f[size_t(i)];
      v = v / c.factor * ramp + v * (1 - ramp);
    }
  }
  return f;
}

RopeTables rope_tables(const RopeConfig& c, int64_t max_positions) {
  TITAN_CHECK(max_positions > 0, "rope: max_positions must be positive, got " + std::to_string(max_positions),
              "pass the longest sequence length the model will see");
  const std::vector<double> f = rope_inv_frequencies(c);
  const double m = rope_table_magnitude(c);
  const int64_t half = c.rope_dims / 2;
  RopeTables t{Tensor::empty({max_positions, half}, DType::f32, MemCategory::parameters),
               Tensor::empty({max_positions, half}, DType::f32, MemCategory::parameters)};
  float* cs = t.cos.data<float>();
  float* sn = t.sin.data<float>();
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(p) * f[size_t(i)];
      cs[p * half + i] = float(m * std::cos(angle));
      sn[p * half + i] = float(m * std::sin(angle));
    }
  }
  return t;
}

namespace {

void rope_apply(bool forward, Tensor& out, const Tensor& in, const RopeTables& t, const Tensor& positions,
                RopeLayout layout, int64_t rope_offset, bool accumulate = true) {
  const char* op = forward ? "rope_forward" : "rope_backward";
  detail::check_activation(in, op, forward ? "x" : "dy");
  detail::check_like(out, in, op, forward ? "y" : "dx");
  TITAN_CHECK(in.dim() >= 2, std::string(op) + ": needs [..., H, Dh] tensors, got " + in.str(),
              "give heads their own dim: .view({N, H, Dh})");
  TITAN_CHECK(t.cos.defined() && t.cos.dim() == 2 && t.cos.dtype() == DType::f32 && t.sin.shape() == t.cos.shape(),
              std::string(op) + ": tables must be two f32 [P, R/2] tensors", "build them with rope_tables()");
  RopeParams s;
  s.heads = in.size(-2);
  s.head_dim = in.size(-1);
  s.tokens = in.numel() / std::max<int64_t>(1, s.heads * s.head_dim);
  s.rope_offset = rope_offset;
  s.rope_dims = 2 * t.cos.size(1);
  s.layout = layout;
  TITAN_CHECK(rope_offset >= 0 && rope_offset + s.rope_dims <= s.head_dim,
              std::string(op) + ": rotated dims [" + std::to_string(rope_offset) + ", " +
                  std::to_string(rope_offset + s.rope_dims) + ") do not fit in a head of " + std::to_string(s.head_dim),
              "check rope_offset and the tables' rope_dims against the head dim");
  TITAN_CHECK(positions.dtype() == DType::i32 && positions.is_contiguous() && positions.numel() == s.tokens,
              std::string(op) + ": positions must be contiguous i32 with one entry per token (" +
                  std::to_string(s.tokens) + "), got " + positions.str(),
              "pass positions shaped like x without its last two dims");
  const int32_t* pos = positions.data<int32_t>();
  const int64_t max_positions = t.cos.size(0);
  for (int64_t n = 0; n < s.tokens; ++n) {
    TITAN_CHECK(pos[n] >= 0 && pos[n] < max_positions,
                std::string(op) + ": position " + std::to_string(pos[n]) + " of token " + std::to_string(n) +
                    " is outside the tables [0, " + std::to_string(max_positions) + ")",
                "build the tables for the longest sequence (rope_tables max_positions)");
  }
  if (s.tokens == 0 || s.heads == 0) return;
  const float* cs = t.cos.data<float>();
  const float* sn = t.sin.data<float>();
  detail::dispatch_activation(in.dtype(), [&]<class T>() {
    if (forward) {
      (detail::use_fast() ? TITAN_CPU_KERNEL(rope_forward<T>) : &ref::rope_forward<T>)(out.data<T>(), in.data<T>(), cs,
                                                                                      sn, pos, s);
    } else if (detail::use_fast()) {
      TITAN_CPU_KERNEL(rope_backward<T>)(out.data<T>(), in.data<T>(), cs, sn, pos, s, accumulate);
    } else {
      if (!accumulate) out.zero_();
      ref::rope_backward<T>(out.data<T>(), in.data<T>(), cs, sn, pos, s);
    }
  });
}

}  // namespace

void rope_forward(Tensor& y, const Tensor& x, const RopeTables& tables, const Tensor& positions, RopeLayout layout,
                  int64_t rope_offset) {
  rope_apply(true, y, x, tables, positions, layout, rope_offset);
}

void rope_backward(Tensor& dx, const Tensor& dy, const RopeTables& tables, const Tensor& positions, RopeLayout layout,
                   int64_t rope_offset, bool accumulate) {
  TITAN_CHECK(!dx.shares_storage(dy), "rope_backward: dx and dy share storage",
              "backward accumulates into dx, so dy must be a separate buffer");
  rope_apply(false, dx, dy, tables, positions, layout, rope_offset, accumulate);
}

}  // namespace titan::kernels
