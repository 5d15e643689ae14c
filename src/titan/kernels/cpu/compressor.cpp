#include "titan/kernels/cpu/compressor.h"

#include <algorithm>
#include <limits>

#include "titan/core/parallel.h"
#include "titan/kernels/cpu/isa.h"
#include "titan/kernels/cpu/scratch.h"

// The softmax of each compressed entry runs per channel over its slots, so the kernel keeps a
// block of kBlock channels in the vector dimension: a thread owns whole channel blocks and walks
// every entry of every sequence for them, in the same order whatever the thread count (dbias, a
// sum over all entries, needs no reduction across threads and comes out the same on any count).
namespace titan::kernels::cpu::TITAN_ISA {

namespace {

using ref::CompressorKind;
constexpr int64_t kBlock = 64;

struct Geometry {
  int64_t B, S, D, m, C, entries, slots;
  CompressorKind kind;
  // Slot r of entry w: its token (negative: none) and channel offset.
  int64_t token(int64_t w, int64_t r) const { return kind == CompressorKind::hca ? w * m + r : w * m + r - m; }
  int64_t channel(int64_t r) const { return kind == CompressorKind::hca || r < m ? 0 : D; }
};

Geometry geometry(int64_t B, int64_t S, int64_t D, int64_t m, CompressorKind kind) {
  const bool hca = kind == CompressorKind::hca;
  return {B, S, D, m, hca ? D : 2 * D, S / m, hca ? m : 2 * m, kind};
}

// Entry w of sequence b, channels [c0, c0 + n): the slot weights into p[slots][kBlock] (0 for a
// slot without a token) and the output into o[kBlock].
void pool(float* p, float* o, const Geometry& g, const float* kv, const float* gate, const float* bias, int64_t b,
          int64_t w, int64_t c0, int64_t n) {
  float mx[kBlock], sum[kBlock];
  for (int64_t i = 0; i < n; ++i) mx[i] = -std::numeric_limits<float>::infinity(), sum[i] = 0, o[i] = 0;
  for (int64_t r = 0; r < g.slots; ++r) {
    const int64_t t = g.token(w, r);
    float* pr = p + r * kBlock;
    if (t < 0) {
      for (int64_t i = 0; i < n; ++i) pr[i] = -std::numeric_limits<float>::infinity();
      continue;
    }
    const float* gr = gate + (b * g.S + t) * g.C + g.channel(r) + c0;
    const float* br = bias + (t % g.m) * g.C + g.channel(r) + c0;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) pr[i] = gr[i] + br[i], mx[i] = std::max(mx[i], pr[i]);
  }
  for (int64_t r = 0; r < g.slots; ++r) {
    float* pr = p + r * kBlock;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) pr[i] = fast_exp(pr[i] - mx[i]), sum[i] += pr[i];
  }
  for (int64_t r = 0; r < g.slots; ++r) {
    float* pr = p + r * kBlock;
    const int64_t t = g.token(w, r);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) pr[i] /= sum[i];
    if (t < 0) continue;
    const float* vr = kv + (b * g.S + t) * g.C + g.channel(r) + c0;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] += pr[i] * vr[i];
  }
}

// Every entry of every sequence, channel block by channel block (a thread owns whole blocks and
// walks them in one order): pools the entry into p (slot weights) and o (outputs), then calls
// f(p, o, b, w, c0, n) for channels [c0, c0 + n).
template <class F>
void for_each_entry(const Geometry& g, const float* kv, const float* gate, const float* bias, F&& f) {
  const int64_t blocks = (g.D + kBlock - 1) / kBlock;
  parallel_for(0, blocks, 1, [&](int64_t k0, int64_t k1) {
    Scratch<float> p(g.slots * kBlock);
    float o[kBlock];
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t c0 = k * kBlock, n = std::min(kBlock, g.D - c0);
      for (int64_t b = 0; b < g.B; ++b)
        for (int64_t w = 0; w < g.entries; ++w) {
          pool(p.data(), o, g, kv, gate, bias, b, w, c0, n);
          f(p.data(), o, b, w, c0, n);
        }
    }
  });
}

}  // namespace

void compressor_forward(float* out, const float* kv, const float* gate, const float* bias, int64_t B, int64_t S,
                        int64_t D, int64_t m, CompressorKind kind) {
  const Geometry g = geometry(B, S, D, m, kind);
  for_each_entry(g, kv, gate, bias, [&](const float*, const float* o, int64_t b, int64_t w, int64_t c0, int64_t n) {
    std::copy(o, o + n, out + (b * g.entries + w) * D + c0);
  });
}

void compressor_backward(float* dkv, float* dgate, float* dbias, const float* dout, const float* kv, const float* gate,
                         const float* bias, int64_t B, int64_t S, int64_t D, int64_t m, CompressorKind kind) {
  const Geometry g = geometry(B, S, D, m, kind);
  for_each_entry(g, kv, gate, bias, [&](const float* p, const float* o, int64_t b, int64_t w, int64_t c0, int64_t n) {
    const float* d = dout + (b * g.entries + w) * D + c0;
    for (int64_t r = 0; r < g.slots; ++r) {
      const int64_t t = g.token(w, r);
      if (t < 0) continue;
      const int64_t at = (b * S + t) * g.C + g.channel(r) + c0;
      const float* pr = p + r * kBlock;
      float* db = dbias + (t % m) * g.C + g.channel(r) + c0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) {
        const float pd = pr[i] * d[i], dlogit = pd * (kv[at + i] - o[i]);
        dkv[at + i] += pd;
        dgate[at + i] += dlogit;
        db[i] += dlogit;
      }
    }
  });
}

}  // namespace titan::kernels::cpu::TITAN_ISA
