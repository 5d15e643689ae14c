#include "titan/kernels/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels::ref {

namespace {

// Row views into the [B, S, heads, width] layouts.
template <class T>
struct Rows {
  const T* base;
  int64_t S, heads, width;
  const T* at(int64_t b, int64_t s, int64_t head) const { return base + ((b * S + s) * heads + head) * width; }
};

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += A(load(x[c])) * A(load(y[c]));
  return s;
}

// Both masks in one form: Sq queries over Skv keys; causal: query i sees keys j <= i (Sq = Skv),
// else every key.
struct Dims {
  int64_t B, Sq, Skv, H, Hkv, Dqk, Dv;
  double scale;
  bool causal;
  int64_t keys_of(int64_t i) const { return causal ? i + 1 : Skv; }
};

Dims causal_dims(const AttentionParams& d) { return {d.B, d.S, d.S, d.H, d.Hkv, d.Dqk, d.Dv, d.scale, true}; }
Dims unmasked_dims(const UnmaskedAttentionParams& d) {
  return {d.B, d.Sq, d.Skv, d.H, d.Hkv, d.Dqk, d.Dv, d.scale, false};
}

template <class T>
void forward(T* o, acc_t<T>* lse, const T* q, const T* k, const T* v, const Dims& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  const int64_t group = d.H / d.Hkv;
  const Rows<T> qr{q, d.Sq, d.H, d.Dqk}, kr{k, d.Skv, d.Hkv, d.Dqk}, vr{v, d.Skv, d.Hkv, d.Dv};
  std::vector<A> acc(size_t(d.Dv));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < d.Sq; ++i) {
        const T* qi = qr.at(b, i, h);
        // Two passes over the keys (max, then exp-sum and weighted values) keep the reference
        // free of any stored score row; scores are recomputed instead.
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t j = 0; j < d.keys_of(i); ++j) m = std::max(m, scale * dot<A>(qi, kr.at(b, j, g), d.Dqk));
        A l = 0;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < d.keys_of(i); ++j) {
          const A p = std::exp(scale * dot<A>(qi, kr.at(b, j, g), d.Dqk) - m);
          l += p;
          const T* vj = vr.at(b, j, g);
          for (int64_t c = 0; c < d.Dv; ++c) acc[size_t(c)] += p * A(load(vj[c]));
        }
        T* oi = o + ((b * d.Sq + i) * d.H + h) * d.Dv;
        for (int64_t c = 0; c < d.Dv; ++c) oi[c] = store<T>(acc[size_t(c)] / l);
        lse[(b * d.H + h) * d.Sq + i] = m + std::log(l);
      }
    }
  }
}

// G: the gradients' type, T's or f32 (bf16 inputs accumulating into f32 gradients).
template <class T, class G>
void backward(G* dq, G* dk, G* dv, const acc_t<T>* lse, const T* dout, const T* q, const T* k, const T* v, const T* o,
              const Dims& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  const int64_t group = d.H / d.Hkv;
  const Rows<T> qr{q, d.Sq, d.H, d.Dqk}, kr{k, d.Skv, d.Hkv, d.Dqk}, vr{v, d.Skv, d.Hkv, d.Dv};
  const Rows<T> dor{dout, d.Sq, d.H, d.Dv}, orows{o, d.Sq, d.H, d.Dv};
  // dk and dv of one kv head collect contributions from every query of its group; they are
  // summed in acc_t and added to the T outputs once, so bf16 rounds once per element.
  std::vector<A> dk_acc(size_t(d.Skv * d.Dqk)), dv_acc(size_t(d.Skv * d.Dv)), dq_acc(size_t(d.Dqk));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.Hkv; ++g) {
      std::fill(dk_acc.begin(), dk_acc.end(), A(0));
      std::fill(dv_acc.begin(), dv_acc.end(), A(0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < d.Sq; ++i) {
          const T* qi = qr.at(b, i, h);
          const T* doi = dor.at(b, i, h);
          const A lse_i = lse[(b * d.H + h) * d.Sq + i];
          const A delta_i = dot<A>(doi, orows.at(b, i, h), d.Dv);  // D_i = rowsum(dO * O)
          std::fill(dq_acc.begin(), dq_acc.end(), A(0));
          for (int64_t j = 0; j < d.keys_of(i); ++j) {
            const T* kj = kr.at(b, j, g);
            const T* vj = vr.at(b, j, g);
            const A p = std::exp(scale * dot<A>(qi, kj, d.Dqk) - lse_i);
            const A ds = p * (dot<A>(doi, vj, d.Dv) - delta_i);  // dS = P (dP - D)
            for (int64_t c = 0; c < d.Dv; ++c) dv_acc[size_t(j * d.Dv + c)] += p * A(load(doi[c]));
            for (int64_t c = 0; c < d.Dqk; ++c) {
              dq_acc[size_t(c)] += scale * ds * A(load(kj[c]));
              dk_acc[size_t(j * d.Dqk + c)] += scale * ds * A(load(qi[c]));
            }
          }
          G* dqi = dq + ((b * d.Sq + i) * d.H + h) * d.Dqk;
          for (int64_t c = 0; c < d.Dqk; ++c) dqi[c] = store<G>(A(load(dqi[c])) + dq_acc[size_t(c)]);
        }
      }
      for (int64_t j = 0; j < d.Skv; ++j) {
        G* dkj = dk + ((b * d.Skv + j) * d.Hkv + g) * d.Dqk;
        G* dvj = dv + ((b * d.Skv + j) * d.Hkv + g) * d.Dv;
        for (int64_t c = 0; c < d.Dqk; ++c) dkj[c] = store<G>(A(load(dkj[c])) + dk_acc[size_t(j * d.Dqk + c)]);
        for (int64_t c = 0; c < d.Dv; ++c) dvj[c] = store<G>(A(load(dvj[c])) + dv_acc[size_t(j * d.Dv + c)]);
      }
    }
  }
}

}  // namespace

template <class T>
void attention_forward(T* o, acc_t<T>* lse, const T* q, const T* k, const T* v, const AttentionParams& d) {
  forward(o, lse, q, k, v, causal_dims(d));
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const acc_t<T>* lse, const T* dout, const T* q, const T* k, const T* v,
                        const T* o, const AttentionParams& d) {
  backward<T, T>(dq, dk, dv, lse, dout, q, k, v, o, causal_dims(d));
}

template <class T>
void attention_unmasked_forward(T* o, acc_t<T>* lse, const T* q, const T* k, const T* v,
                                const UnmaskedAttentionParams& d) {
  forward(o, lse, q, k, v, unmasked_dims(d));
}

template <class T, class G>
void attention_unmasked_backward(G* dq, G* dk, G* dv, const acc_t<T>* lse, const T* dout, const T* q, const T* k,
                                 const T* v, const T* o, const UnmaskedAttentionParams& d) {
  backward<T, G>(dq, dk, dv, lse, dout, q, k, v, o, unmasked_dims(d));
}

#define TITAN_INSTANTIATE_ATTENTION(T)                                                                     \
  template void attention_forward<T>(T*, acc_t<T>*, const T*, const T*, const T*, const AttentionParams&); \
  template void attention_backward<T>(T*, T*, T*, const acc_t<T>*, const T*, const T*, const T*, const T*, \
                                      const T*, const AttentionParams&);                                    \
  template void attention_unmasked_forward<T>(T*, acc_t<T>*, const T*, const T*, const T*,                 \
                                              const UnmaskedAttentionParams&);                             \
  template void attention_unmasked_backward<T, T>(T*, T*, T*, const acc_t<T>*, const T*, const T*, const T*, \
                                                  const T*, const T*, const UnmaskedAttentionParams&);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE_ATTENTION)
// bf16 inputs with f32 gradients (ring attention accumulates in f32).
template void attention_unmasked_backward<bf16, float>(float*, float*, float*, const float*, const bf16*, const bf16*,
                                                       const bf16*, const bf16*, const bf16*,
                                                       const UnmaskedAttentionParams&);

}  // namespace titan::kernels::ref
