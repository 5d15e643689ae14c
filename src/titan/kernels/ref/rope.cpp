#include "titan/kernels/ref/rope.h"

namespace titan::kernels::ref {

namespace {
// Element offsets (within a head) of the two members of pair i.
struct PairIndex {
  int64_t first, second;
};
PairIndex pair_index(const RopeParams& s, int64_t i) {
  if (s.layout == RopeLayout::interleaved) return {s.rope_offset + 2 * i, s.rope_offset + 2 * i + 1};
  return {s.rope_offset + i, s.rope_offset + i + s.rope_dims / 2};
}
bool rotated(const RopeParams& s, int64_t d) { return d >= s.rope_offset && d < s.rope_offset + s.rope_dims; }

// out(a, b) = (a c - b sn, a sn + b c) for sign = +1 (forward) or the transpose for sign = -1.
// accumulate: out += instead of out =.
template <class T>
void rotate(T* out, const T* in, const acc_t<T>* cos, const acc_t<T>* sin, const int32_t* positions,
            const RopeParams& s, acc_t<T> sign, bool accumulate) {
  using A = acc_t<T>;
  const int64_t half = s.rope_dims / 2;
  for (int64_t n = 0; n < s.tokens; ++n) {
    const A* c = cos + int64_t(positions[n]) * half;
    const A* sn = sin + int64_t(positions[n]) * half;
    for (int64_t h = 0; h < s.heads; ++h) {
      const int64_t base = (n * s.heads + h) * s.head_dim;
      // Pairs first (reading both members before writing either, so out may alias in).
      for (int64_t i = 0; i < half; ++i) {
        const PairIndex p = pair_index(s, i);
        const A a = load(in[base + p.first]), b = load(in[base + p.second]);
        const A ra = a * c[i] - sign * b * sn[i];
        const A rb = sign * a * sn[i] + b * c[i];
        out[base + p.first] = store<T>(accumulate ? load(out[base + p.first]) + ra : ra);
        out[base + p.second] = store<T>(accumulate ? load(out[base + p.second]) + rb : rb);
      }
      for (int64_t d = 0; d < s.head_dim; ++d) {
        if (rotated(s, d)) continue;
        const A v = load(in[base + d]);
        out[base + d] = store<T>(accumulate ? load(out[base + d]) + v : v);
      }
    }
  }
}
}  // namespace

template <class T>
void rope_forward(T* y, const T* x, const acc_t<T>* cos, const acc_t<T>* sin, const int32_t* positions,
                  const RopeParams& s) {
  rotate(y, x, cos, sin, positions, s, acc_t<T>(1), false);
}

template <class T>
void rope_backward(T* dx, const T* dy, const acc_t<T>* cos, const acc_t<T>* sin, const int32_t* positions,
                   const RopeParams& s) {
  rotate(dx, dy, cos, sin, positions, s, acc_t<T>(-1), true);
}

#define TITAN_INSTANTIATE(T)                                                                                        \
  template void rope_forward<T>(T*, const T*, const acc_t<T>*, const acc_t<T>*, const int32_t*, const RopeParams&); \
  template void rope_backward<T>(T*, const T*, const acc_t<T>*, const acc_t<T>*, const int32_t*, const RopeParams&);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
