#include "titan/kernels/cpu/rope.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"

namespace titan::kernels::cpu::TITAN_ISA {

namespace {

constexpr int64_t kGrainElements = 1 << 15;  // per thread chunk: below this, threads cost more than they save

// One head's rotated slice. sign = +1: forward rotation by theta, written to out (which may be
// in). sign = -1: rotation by -theta (the transpose), added to out.
template <class T, bool kAccumulate>
TITAN_INLINE void rotate_head(T* out, const T* in, const float* c, const float* sn, float sign, int64_t half,
                              RopeLayout layout) {
  if (layout == RopeLayout::interleaved) {
    // Scalar math: (a, b) = (in[2i], in[2i+1]); out[2i] (+)= a c - sign b s; out[2i+1] (+)= sign a s + b c
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = to_f32(in[2 * i]), b = to_f32(in[2 * i + 1]);
      const float s = sign * sn[i];
      float ra = a * c[i] - b * s, rb = a * s + b * c[i];
      if constexpr (kAccumulate) ra += to_f32(out[2 * i]), rb += to_f32(out[2 * i + 1]);
      out[2 * i] = from_f32<T>(ra);
      out[2 * i + 1] = from_f32<T>(rb);
    }
  } else {
    // Scalar math: (a, b) = (in[i], in[i+R/2]); out[i] (+)= a c - sign b s; out[i+R/2] (+)= sign a s + b c
    const T* in2 = in + half;
    T* out2 = out + half;
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float a = to_f32(in[i]), b = to_f32(in2[i]);
      const float s = sign * sn[i];
      float ra = a * c[i] - b * s, rb = a * s + b * c[i];
      if constexpr (kAccumulate) ra += to_f32(out[i]), rb += to_f32(out2[i]);
      out[i] = from_f32<T>(ra);
      out2[i] = from_f32<T>(rb);
    }
  }
}

// The dims a head leaves unrotated: copied (forward, skipped when in place) or accumulated (backward).
template <class T, bool kAccumulate>
TITAN_INLINE void pass_through(T* out, const T* in, int64_t n) {
  if constexpr (kAccumulate) {
    // Scalar math: out += in
#pragma omp simd
    for (int64_t d = 0; d < n; ++d) out[d] = from_f32<T>(to_f32(out[d]) + to_f32(in[d]));
  } else {
    if (out != in && n > 0) std::memcpy(out, in, size_t(n) * sizeof(T));
  }
}

template <class T, bool kAccumulate>
void rope_apply(T* out, const T* in, const float* cos, const float* sin, const int32_t* positions,
                const RopeShape& s, float sign) {
  const int64_t half = s.rope_dims / 2;
  const int64_t tail = s.head_dim - s.rope_offset - s.rope_dims;
  const int64_t grain = kGrainElements / (s.heads * s.head_dim) + 1;
  parallel_for(0, s.tokens, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n) {
      const float* c = cos + int64_t(positions[n]) * half;
      const float* sn = sin + int64_t(positions[n]) * half;
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t base = (n * s.heads + h) * s.head_dim;
        pass_through<T, kAccumulate>(out + base, in + base, s.rope_offset);
        const int64_t r = base + s.rope_offset;
        rotate_head<T, kAccumulate>(out + r, in + r, c, sn, sign, half, s.layout);
        pass_through<T, kAccumulate>(out + r + s.rope_dims, in + r + s.rope_dims, tail);
      }
    }
  });
}

}  // namespace

template <class T>
void rope_forward(T* y, const T* x, const float* cos, const float* sin, const int32_t* positions,
                  const RopeShape& s) {
  rope_apply<T, false>(y, x, cos, sin, positions, s, 1.0f);
}

template <class T>
void rope_backward(T* dx, const T* dy, const float* cos, const float* sin, const int32_t* positions,
                   const RopeShape& s) {
  rope_apply<T, true>(dx, dy, cos, sin, positions, s, -1.0f);
}

template void rope_forward<float>(float*, const float*, const float*, const float*, const int32_t*, const RopeShape&);
template void rope_forward<bf16>(bf16*, const bf16*, const float*, const float*, const int32_t*, const RopeShape&);
template void rope_backward<float>(float*, const float*, const float*, const float*, const int32_t*, const RopeShape&);
template void rope_backward<bf16>(bf16*, const bf16*, const float*, const float*, const int32_t*, const RopeShape&);

}  // namespace titan::kernels::cpu::TITAN_ISA
