#include "titan/kernels/ref/compressor.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels::ref {

namespace {

// Where slot r of entry w reads: its token (negative: none) and the channel offset.
struct Slot {
  int64_t token, channel;
};
Slot slot_of(int64_t w, int64_t r, int64_t m, int64_t D, CompressorKind kind) {
  if (kind == CompressorKind::hca) return {w * m + r, 0};
  return {w * m + r - m, r < m ? 0 : D};
}

// The slot weights of entry w's channel c (into p, 0 for a slot with no token) and its output.
template <class T>
T pool(std::vector<T>& p, const T* kv, const T* gate, const T* bias, int64_t w, int64_t c, int64_t C, int64_t D,
       int64_t m, CompressorKind kind) {
  const int64_t slots = kind == CompressorKind::hca ? m : 2 * m;
  T best = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < slots; ++r) {
    const Slot s = slot_of(w, r, m, D, kind);
    p[size_t(r)] = s.token < 0 ? -std::numeric_limits<T>::infinity()
                               : gate[s.token * C + s.channel + c] + bias[(s.token % m) * C + s.channel + c];
    best = std::max(best, p[size_t(r)]);
  }
  T sum = 0;
  for (int64_t r = 0; r < slots; ++r) sum += p[size_t(r)] = std::exp(p[size_t(r)] - best);
  T o = 0;
  for (int64_t r = 0; r < slots; ++r) {
    p[size_t(r)] /= sum;
    const Slot s = slot_of(w, r, m, D, kind);
    if (s.token >= 0) o += p[size_t(r)] * kv[s.token * C + s.channel + c];
  }
  return o;
}

int64_t channels(int64_t D, CompressorKind kind) { return kind == CompressorKind::hca ? D : 2 * D; }

}  // namespace

template <class T>
void compressor_forward(T* out, const T* kv, const T* gate, const T* bias, int64_t B, int64_t S, int64_t D, int64_t m,
                        CompressorKind kind) {
  const int64_t C = channels(D, kind), entries = S / m;
  std::vector<T> p(size_t(2 * m));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < entries; ++w)
      for (int64_t c = 0; c < D; ++c)
        out[(b * entries + w) * D + c] = pool(p, kv + b * S * C, gate + b * S * C, bias, w, c, C, D, m, kind);
}

template <class T>
void compressor_backward(T* dkv, T* dgate, T* dbias, const T* dout, const T* kv, const T* gate, const T* bias, int64_t B,
                         int64_t S, int64_t D, int64_t m, CompressorKind kind) {
  const int64_t C = channels(D, kind), entries = S / m, slots = kind == CompressorKind::hca ? m : 2 * m;
  std::vector<T> p(size_t(2 * m));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < entries; ++w)
      for (int64_t c = 0; c < D; ++c) {
        const T* kvb = kv + b * S * C;
        const T o = pool(p, kvb, gate + b * S * C, bias, w, c, C, D, m, kind);
        const T d = dout[(b * entries + w) * D + c];
        for (int64_t r = 0; r < slots; ++r) {
          const Slot s = slot_of(w, r, m, D, kind);
          if (s.token < 0) continue;
          const int64_t at = s.token * C + s.channel + c;
          const T dlogit = p[size_t(r)] * d * (kvb[at] - o);
          dkv[b * S * C + at] += p[size_t(r)] * d;
          dgate[b * S * C + at] += dlogit;
          dbias[(s.token % m) * C + s.channel + c] += dlogit;
        }
      }
}

#define TITAN_INSTANTIATE(T)                                                                                        \
  template void compressor_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,         \
                                      CompressorKind);                                                             \
  template void compressor_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, \
                                       int64_t, CompressorKind);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(double)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
