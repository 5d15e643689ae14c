#include "titan/kernels/cpu/rope.h"

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"
#if defined(TITAN_AVX512_ROWS)
#include "titan/kernels/cpu/avx512.h"
#endif

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

#if defined(TITAN_AVX512_ROWS)
// The avx512_bf16 variant: each token's cos/sin are first laid out as the lanes need them, so a
// head is a few FMAs per 16 elements and interleaved pairs swap in registers (VPERMILPS) instead
// of GCC's strided loads and stores. Tables, for sign s' = sign * sin:
//   interleaved: C[2i] = C[2i+1] = cos_i; S[2i] = -s'_i, S[2i+1] = s'_i   (rope_dims each)
//   rotate_half: C[i] = cos_i; S[i] = s'_i                                  (rope_dims / 2 each)
TITAN_INLINE void lane_tables(float* C, float* S, const float* c, const float* sn, float sign, int64_t half,
                              RopeLayout layout) {
  if (layout == RopeLayout::interleaved) {
    const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512 signs = _mm512_set_ps(sign, -sign, sign, -sign, sign, -sign, sign, -sign, sign, -sign, sign, -sign,
                                       sign, -sign, sign, -sign);
    for (int64_t i = 0; i < half; i += 8) {
      const __mmask8 k8 = half - i >= 8 ? __mmask8(0xff) : __mmask8((1u << (half - i)) - 1);
      const __m512 cv = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, c + i));
      const __m512 sv = _mm512_castps256_ps512(_mm256_maskz_loadu_ps(k8, sn + i));
      const __mmask16 k = lanes(2 * (half - i));
      _mm512_mask_storeu_ps(C + 2 * i, k, _mm512_permutexvar_ps(dup, cv));
      _mm512_mask_storeu_ps(S + 2 * i, k, _mm512_mul_ps(_mm512_permutexvar_ps(dup, sv), signs));
    }
  } else {
    const __m512 sg = _mm512_set1_ps(sign);
    for (int64_t i = 0; i < half; i += 16) {
      const __mmask16 k = lanes(half - i);
      _mm512_mask_storeu_ps(C + i, k, _mm512_maskz_loadu_ps(k, c + i));
      _mm512_mask_storeu_ps(S + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, sn + i), sg));
    }
  }
}

// One step of 16 interleaved elements (8 pairs) at offset j, lanes k: out (+)= v C + swap(v) S.
template <class T, bool kAccumulate>
TITAN_INLINE void rotate_pairs16(T* out, const T* in, const float* C, const float* S, int64_t j, __mmask16 k) {
  const __m512 v = load16(in + j, k);
  const __m512 swapped = _mm512_permute_ps(v, 0xb1);  // (a, b) -> (b, a) in every pair
  __m512 r = _mm512_fmadd_ps(v, _mm512_loadu_ps(C + j), _mm512_mul_ps(swapped, _mm512_loadu_ps(S + j)));
  if constexpr (kAccumulate) r = _mm512_add_ps(r, load16(out + j, k));
  store16(out + j, r, k);
}

// One step of 16 rotate_half pairs (i, i + half) at offset i, lanes k.
template <class T, bool kAccumulate>
TITAN_INLINE void rotate_halves16(T* out, const T* in, const float* C, const float* S, int64_t half, int64_t i,
                                  __mmask16 k) {
  const __m512 a = load16(in + i, k), b = load16(in + half + i, k);
  const __m512 c = _mm512_loadu_ps(C + i), s = _mm512_loadu_ps(S + i);
  __m512 ra = _mm512_fnmadd_ps(b, s, _mm512_mul_ps(a, c)), rb = _mm512_fmadd_ps(a, s, _mm512_mul_ps(b, c));
  if constexpr (kAccumulate) {
    ra = _mm512_add_ps(ra, load16(out + i, k));
    rb = _mm512_add_ps(rb, load16(out + half + i, k));
  }
  store16(out + i, ra, k);
  store16(out + half + i, rb, k);
}

// rotate_head with the lane tables: full 16-lane steps (the all-lanes mask folds away), then
// one masked tail.
template <class T, bool kAccumulate>
TITAN_INLINE void rotate_head_avx512(T* out, const T* in, const float* C, const float* S, int64_t half,
                                     RopeLayout layout) {
  const int64_t n = layout == RopeLayout::interleaved ? 2 * half : half;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    if (layout == RopeLayout::interleaved) {
      rotate_pairs16<T, kAccumulate>(out, in, C, S, j, __mmask16(0xffff));
    } else {
      rotate_halves16<T, kAccumulate>(out, in, C, S, half, j, __mmask16(0xffff));
    }
  }
  if (j == n) return;
  if (layout == RopeLayout::interleaved) {
    rotate_pairs16<T, kAccumulate>(out, in, C, S, j, lanes(n - j));
  } else {
    rotate_halves16<T, kAccumulate>(out, in, C, S, half, j, lanes(n - j));
  }
}

// pass_through's accumulating form, 16 lanes at a time: out += in.
template <class T>
TITAN_INLINE void accumulate_avx512(T* out, const T* in, int64_t n) {
  for (int64_t d = 0; d < n; d += 16) {
    const __mmask16 k = lanes(n - d);
    store16(out + d, _mm512_add_ps(load16(out + d, k), load16(in + d, k)), k);
  }
}
#endif

template <class T, bool kAccumulate>
void rope_apply(T* out, const T* in, const float* cos, const float* sin, const int32_t* positions,
                const RopeParams& s, float sign) {
  const int64_t half = s.rope_dims / 2;
  const int64_t tail = s.head_dim - s.rope_offset - s.rope_dims;
  const int64_t grain = kGrainElements / (s.heads * s.head_dim) + 1;
  parallel_for(0, s.tokens, grain, [&](int64_t lo, int64_t hi) {
#if defined(TITAN_AVX512_ROWS)
    // [rope_dims] each (+16: a masked tail step loads a whole vector of them)
    Scratch<float> C(s.rope_dims + 16), S(s.rope_dims + 16);
#endif
    for (int64_t n = lo; n < hi; ++n) {
      const float* c = cos + int64_t(positions[n]) * half;
      const float* sn = sin + int64_t(positions[n]) * half;
#if defined(TITAN_AVX512_ROWS)
      lane_tables(C.data(), S.data(), c, sn, sign, half, s.layout);
#endif
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t base = (n * s.heads + h) * s.head_dim;
        const int64_t r = base + s.rope_offset;
#if defined(TITAN_AVX512_ROWS)
        if constexpr (kAccumulate) {
          accumulate_avx512(out + base, in + base, s.rope_offset);
          accumulate_avx512(out + r + s.rope_dims, in + r + s.rope_dims, tail);
        } else {
          pass_through<T, false>(out + base, in + base, s.rope_offset);
          pass_through<T, false>(out + r + s.rope_dims, in + r + s.rope_dims, tail);
        }
        rotate_head_avx512<T, kAccumulate>(out + r, in + r, C.data(), S.data(), half, s.layout);
#else
        pass_through<T, kAccumulate>(out + base, in + base, s.rope_offset);
        rotate_head<T, kAccumulate>(out + r, in + r, c, sn, sign, half, s.layout);
        pass_through<T, kAccumulate>(out + r + s.rope_dims, in + r + s.rope_dims, tail);
#endif
      }
    }
  });
}

}  // namespace

template <class T>
void rope_forward(T* y, const T* x, const float* cos, const float* sin, const int32_t* positions,
                  const RopeParams& s) {
  rope_apply<T, false>(y, x, cos, sin, positions, s, 1.0f);
}

// accumulate false: dx = RoPE^T(dy), written (the forward's pass with the rotation reversed).
template <class T>
void rope_backward(T* dx, const T* dy, const float* cos, const float* sin, const int32_t* positions,
                   const RopeParams& s, bool accumulate) {
  if (accumulate) {
    rope_apply<T, true>(dx, dy, cos, sin, positions, s, -1.0f);
  } else {
    rope_apply<T, false>(dx, dy, cos, sin, positions, s, -1.0f);
  }
}

template void rope_forward<float>(float*, const float*, const float*, const float*, const int32_t*, const RopeParams&);
template void rope_forward<bf16>(bf16*, const bf16*, const float*, const float*, const int32_t*, const RopeParams&);
template void rope_backward<float>(float*, const float*, const float*, const float*, const int32_t*, const RopeParams&,
                                   bool);
template void rope_backward<bf16>(bf16*, const bf16*, const float*, const float*, const int32_t*, const RopeParams&,
                                  bool);

}  // namespace titan::kernels::cpu::TITAN_ISA
