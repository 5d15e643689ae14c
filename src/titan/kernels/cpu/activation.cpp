#include "titan/kernels/cpu/activation.h"

#include <algorithm>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/chunks.h"
#include "titan/kernels/cpu/isa.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

// Each kernel hands contiguous spans to a force-inlined span function: with the pointers as plain
// parameters (not captured by a lambda) GCC vectorizes the loops. Spans run in chunks
// (cpu/chunks.h) that prefetch ahead, round bf16 outputs in bulk and stream large forward outputs.
namespace titan::kernels::cpu::TITAN_ISA {

namespace {
// Elements per thread chunk. The exp makes each element ~20 flops, so chunks can be smaller than
// a pure copy's before threading pays.
constexpr int64_t kGrain = 1 << 13;

// fast_exp(-x) overflows to inf for x < -88.7, and 1 / inf = 0, the limit.
TITAN_INLINE float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

#if defined(TITAN_AVX512_ROWS)
// sigmoid in 16 lanes: 1 / (1 + 2^(-x log2 e)) with exp2_16 (cpu/avx512.h) and a reciprocal
// estimate refined by one Newton step (relative error ~2^-23), where VDIVPS alone cost the bf16
// SwiGLU forward more than its memory traffic. The exponent is capped at 126 so the denominator
// stays finite: x below -87.3 gives 2^-126 instead of a smaller positive number. NaN stays NaN
// (VMINPS returns its second operand, t, when either is NaN).
TITAN_INLINE __m512 sigmoid16(__m512 x) {
  const __m512 t = _mm512_min_ps(_mm512_set1_ps(126.0f), _mm512_mul_ps(x, _mm512_set1_ps(-1.4426950408889634f)));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), exp2_16(t));
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}
#endif

// streaming: write y with streaming stores (cpu/chunks.h).
template <class T>
TITAN_INLINE void silu_forward_span(T* y, const T* x, int64_t n, bool streaming) {
  ChunkOut<T> out(streaming);
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, n);
    prefetch_ahead(x, j0, j1, n);
    float* o = out.at(y, j0);
    // Scalar math: y = x * sigmoid(x)
#pragma omp simd
    for (int64_t i = j0; i < j1; ++i) {
      const float v = to_f32(x[i]);
      o[i - j0] = v * sigmoid(v);
    }
    out.flush(y, j0, j1);
  }
}

template <class T>
TITAN_INLINE void silu_backward_span(T* dx, const T* dy, const T* x, int64_t n) {
  ChunkOut<T> out;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, n);
    prefetch_ahead(dy, j0, j1, n);
    prefetch_ahead(x, j0, j1, n);
    prefetch_ahead(dx, j0, j1, n);
    float* o = out.at(dx, j0);
    // Scalar math: dx += dy * s * (1 + x * (1 - s)), s = sigmoid(x)
#pragma omp simd
    for (int64_t i = j0; i < j1; ++i) {
      const float v = to_f32(x[i]), s = sigmoid(v);
      o[i - j0] = to_f32(dx[i]) + to_f32(dy[i]) * s * (1.0f + v * (1.0f - s));
    }
    out.flush(dx, j0, j1);
  }
}

// SwiGLU's clamps (ref/activation.h): an infinite limit changes nothing, a NaN stays NaN
// (std::min / std::max return their first argument when the comparison is false), and a
// gradient passes unless its input is beyond the bound.
TITAN_INLINE float clamp_gate(float g, float limit) { return std::min(g, limit); }
TITAN_INLINE float clamp_up(float u, float limit) { return std::max(std::min(u, limit), -limit); }

// streaming: write y with streaming stores (cpu/chunks.h).
template <class T>
TITAN_INLINE void swiglu_forward_span(T* y, const T* gate, const T* up, int64_t n, float limit, bool streaming) {
  ChunkOut<T> out(streaming);
#if defined(TITAN_AVX512_ROWS)
  // VMINPS / VMAXPS return their second operand when either is NaN: the limits go first.
  const __m512 hi = _mm512_set1_ps(limit), lo = _mm512_set1_ps(-limit);
#endif
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, n);
    prefetch_ahead(gate, j0, j1, n);
    prefetch_ahead(up, j0, j1, n);
    float* o = out.at(y, j0);
#if defined(TITAN_AVX512_ROWS)
    for (int64_t i = j0; i < j1; i += 16) {
      const __mmask16 m = lanes(j1 - i);
      const __m512 g = _mm512_min_ps(hi, load16(gate + i, m));
      const __m512 u = _mm512_max_ps(lo, _mm512_min_ps(hi, load16(up + i, m)));
      _mm512_mask_storeu_ps(o + (i - j0), m, _mm512_mul_ps(_mm512_mul_ps(g, sigmoid16(g)), u));
    }
#else
    // Scalar math: g = min(gate, limit); y = g * sigmoid(g) * clamp(up, -limit, limit)
#pragma omp simd
    for (int64_t i = j0; i < j1; ++i) {
      const float g = clamp_gate(to_f32(gate[i]), limit);
      o[i - j0] = g * sigmoid(g) * clamp_up(to_f32(up[i]), limit);
    }
#endif
    out.flush(y, j0, j1);
  }
}

template <class T, bool kAccumulate>
TITAN_INLINE void swiglu_backward_span(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n,
                                       float limit) {
  ChunkOut<T> out_gate, out_up;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    const int64_t j1 = chunk_end(j0, n);
    prefetch_ahead(dy, j0, j1, n);
    prefetch_ahead(gate, j0, j1, n);
    prefetch_ahead(up, j0, j1, n);
    if constexpr (kAccumulate) {
      prefetch_ahead(dgate, j0, j1, n);
      prefetch_ahead(dup, j0, j1, n);
    }
    float* og = out_gate.at(dgate, j0);
    float* ou = out_up.at(dup, j0);
    // Scalar math: g, u = the clamped gate, up; s = sigmoid(g);
    //   dgate (+)= dy * u * s * (1 + g * (1 - s)) unless gate > limit;
    //   dup (+)= dy * g * s unless |up| > limit
#pragma omp simd
    for (int64_t i = j0; i < j1; ++i) {
      const float g_in = to_f32(gate[i]), u_in = to_f32(up[i]);
      const float g = clamp_gate(g_in, limit), u = clamp_up(u_in, limit), s = sigmoid(g), d = to_f32(dy[i]);
      const float dg = g_in > limit ? 0.0f : d * u * s * (1.0f + g * (1.0f - s));
      const float du = u_in > limit || u_in < -limit ? 0.0f : d * g * s;
      og[i - j0] = kAccumulate ? to_f32(dgate[i]) + dg : dg;
      ou[i - j0] = kAccumulate ? to_f32(dup[i]) + du : du;
    }
    out_gate.flush(dgate, j0, j1);
    out_up.flush(dup, j0, j1);
  }
}
}  // namespace

template <class T>
void silu_forward(T* y, const T* x, int64_t n) {
  const bool streaming = n * int64_t(sizeof(T)) >= kStreamingBytes;
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    silu_forward_span(y + lo, x + lo, hi - lo, streaming);
    if (streaming) streaming_done();
  });
}

template <class T>
void silu_backward(T* dx, const T* dy, const T* x, int64_t n) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) { silu_backward_span(dx + lo, dy + lo, x + lo, hi - lo); });
}

template <class T>
void swiglu_forward(T* y, const T* gate, const T* up, int64_t n, float limit) {
  const bool streaming = n * int64_t(sizeof(T)) >= kStreamingBytes;
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    swiglu_forward_span(y + lo, gate + lo, up + lo, hi - lo, limit, streaming);
    if (streaming) streaming_done();
  });
}

template <class T>
void swiglu_backward(T* dgate, T* dup, const T* dy, const T* gate, const T* up, int64_t n, bool accumulate,
                     float limit) {
  parallel_for(0, n, kGrain, [&](int64_t lo, int64_t hi) {
    if (accumulate) {
      swiglu_backward_span<T, true>(dgate + lo, dup + lo, dy + lo, gate + lo, up + lo, hi - lo, limit);
    } else {
      swiglu_backward_span<T, false>(dgate + lo, dup + lo, dy + lo, gate + lo, up + lo, hi - lo, limit);
    }
  });
}

#define TITAN_INSTANTIATE(T)                                                            \
  template void silu_forward<T>(T*, const T*, int64_t);                                 \
  template void silu_backward<T>(T*, const T*, const T*, int64_t);                      \
  template void swiglu_forward<T>(T*, const T*, const T*, int64_t, float);              \
  template void swiglu_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, bool, float);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(bf16)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::cpu::TITAN_ISA
