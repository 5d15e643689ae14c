#include "titan/kernels/ref/attention_unmasked.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels::ref {

namespace {

// Row (b, s, head) of a [B, S, heads, width] layout.
template <class T>
const T* row(const T* base, int64_t S, int64_t heads, int64_t width, int64_t b, int64_t s, int64_t head) {
  return base + ((b * S + s) * heads + head) * width;
}

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += A(load(x[c])) * A(load(y[c]));
  return s;
}

}  // namespace

template <class T>
void attention_unmasked_forward(T* o, acc_t<T>* lse, const T* q, const T* k, const T* v,
                                const UnmaskedAttentionParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  const int64_t group = d.H / d.Hkv;
  std::vector<A> acc(size_t(d.Dv));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < d.Sq; ++i) {
        const T* qi = row(q, d.Sq, d.H, d.Dqk, b, i, h);
        auto score = [&](int64_t j) { return scale * dot<A>(qi, row(k, d.Skv, d.Hkv, d.Dqk, b, j, g), d.Dqk); };
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t j = 0; j < d.Skv; ++j) m = std::max(m, score(j));
        A l = 0;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t j = 0; j < d.Skv; ++j) {
          const A p = std::exp(score(j) - m);
          l += p;
          const T* vj = row(v, d.Skv, d.Hkv, d.Dv, b, j, g);
          for (int64_t c = 0; c < d.Dv; ++c) acc[size_t(c)] += p * A(load(vj[c]));
        }
        T* oi = o + ((b * d.Sq + i) * d.H + h) * d.Dv;
        for (int64_t c = 0; c < d.Dv; ++c) oi[c] = store<T>(acc[size_t(c)] / l);
        lse[(b * d.H + h) * d.Sq + i] = m + std::log(l);
      }
    }
  }
}

template <class T>
void attention_unmasked_backward(T* dq, T* dk, T* dv, const acc_t<T>* lse, const T* dout, const T* q, const T* k,
                                 const T* v, const T* o, const UnmaskedAttentionParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  const int64_t group = d.H / d.Hkv;
  // One kv head's dk and dv collect every query of its group in acc_t, added to T once.
  std::vector<A> dk_acc(size_t(d.Skv * d.Dqk)), dv_acc(size_t(d.Skv * d.Dv)), dq_acc(size_t(d.Dqk));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t g = 0; g < d.Hkv; ++g) {
      std::fill(dk_acc.begin(), dk_acc.end(), A(0));
      std::fill(dv_acc.begin(), dv_acc.end(), A(0));
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < d.Sq; ++i) {
          const T* qi = row(q, d.Sq, d.H, d.Dqk, b, i, h);
          const T* doi = row(dout, d.Sq, d.H, d.Dv, b, i, h);
          const A lse_i = lse[(b * d.H + h) * d.Sq + i];
          const A delta_i = dot<A>(doi, row(o, d.Sq, d.H, d.Dv, b, i, h), d.Dv);  // D_i = rowsum(dO * O)
          std::fill(dq_acc.begin(), dq_acc.end(), A(0));
          for (int64_t j = 0; j < d.Skv; ++j) {
            const T* kj = row(k, d.Skv, d.Hkv, d.Dqk, b, j, g);
            const T* vj = row(v, d.Skv, d.Hkv, d.Dv, b, j, g);
            const A p = std::exp(scale * dot<A>(qi, kj, d.Dqk) - lse_i);
            const A ds = p * (dot<A>(doi, vj, d.Dv) - delta_i);  // dS = P (dP - D)
            for (int64_t c = 0; c < d.Dv; ++c) dv_acc[size_t(j * d.Dv + c)] += p * A(load(doi[c]));
            for (int64_t c = 0; c < d.Dqk; ++c) {
              dq_acc[size_t(c)] += scale * ds * A(load(kj[c]));
              dk_acc[size_t(j * d.Dqk + c)] += scale * ds * A(load(qi[c]));
            }
          }
          T* dqi = dq + ((b * d.Sq + i) * d.H + h) * d.Dqk;
          for (int64_t c = 0; c < d.Dqk; ++c) dqi[c] = store<T>(A(load(dqi[c])) + dq_acc[size_t(c)]);
        }
      }
      for (int64_t j = 0; j < d.Skv; ++j) {
        T* dkj = dk + ((b * d.Skv + j) * d.Hkv + g) * d.Dqk;
        T* dvj = dv + ((b * d.Skv + j) * d.Hkv + g) * d.Dv;
        for (int64_t c = 0; c < d.Dqk; ++c) dkj[c] = store<T>(A(load(dkj[c])) + dk_acc[size_t(j * d.Dqk + c)]);
        for (int64_t c = 0; c < d.Dv; ++c) dvj[c] = store<T>(A(load(dvj[c])) + dv_acc[size_t(j * d.Dv + c)]);
      }
    }
  }
}

#define TITAN_INSTANTIATE_ATTENTION_UNMASKED(T)                                                          \
  template void attention_unmasked_forward<T>(T*, acc_t<T>*, const T*, const T*, const T*,              \
                                              const UnmaskedAttentionParams&);                          \
  template void attention_unmasked_backward<T>(T*, T*, T*, const acc_t<T>*, const T*, const T*, const T*, \
                                               const T*, const T*, const UnmaskedAttentionParams&);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE_ATTENTION_UNMASKED)

}  // namespace titan::kernels::ref
