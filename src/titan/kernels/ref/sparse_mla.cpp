#include "titan/kernels/ref/sparse_mla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels::ref {

namespace {

template <class A, class T>
A dot(const T* x, const T* y, int64_t n) {
  A s = 0;
  for (int64_t c = 0; c < n; ++c) s += A(load(x[c])) * A(load(y[c]));
  return s;
}

}  // namespace

template <class T>
void sparse_mla_forward(T* o, acc_t<T>* lse, acc_t<T>* head_mean, const T* q, const T* kv, const int32_t* idx,
                        const SparseMlaParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  std::vector<A> scores(size_t(d.K)), acc(size_t(d.Dv));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      const int32_t* sel = idx + (b * d.S + t) * d.K;
      A* hm = head_mean ? head_mean + (b * d.S + t) * d.K : nullptr;
      if (hm) std::fill(hm, hm + d.K, A(0));
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        const T* qh = q + row * d.Dqk;
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t i = 0; i < d.K; ++i) {
          const bool valid = sparse_mla_slot_valid(sel[i], t, d);
          scores[size_t(i)] = valid ? scale * dot<A>(qh, kv + (b * d.Skv + sel[i]) * d.Dqk, d.Dqk)
                                    : -std::numeric_limits<A>::infinity();
          m = std::max(m, scores[size_t(i)]);
        }
        T* oh = o + row * d.Dv;
        if (m == -std::numeric_limits<A>::infinity()) {  // no valid slot: FlashMLA's convention
          for (int64_t c = 0; c < d.Dv; ++c) oh[c] = store<T>(A(0));
          lse[row] = std::numeric_limits<A>::infinity();
          continue;
        }
        A l = 0;
        std::fill(acc.begin(), acc.end(), A(0));
        for (int64_t i = 0; i < d.K; ++i) {
          if (!sparse_mla_slot_valid(sel[i], t, d)) continue;
          const A p = std::exp(scores[size_t(i)] - m);
          l += p;
          const T* v = kv + (b * d.Skv + sel[i]) * d.Dqk;
          for (int64_t c = 0; c < d.Dv; ++c) acc[size_t(c)] += p * A(load(v[c]));
        }
        for (int64_t c = 0; c < d.Dv; ++c) oh[c] = store<T>(acc[size_t(c)] / l);
        lse[row] = m + std::log(l);
        if (!hm) continue;
        for (int64_t i = 0; i < d.K; ++i) {
          if (sparse_mla_slot_valid(sel[i], t, d)) hm[i] += std::exp(scores[size_t(i)] - lse[row]) / A(d.H);
        }
      }
    }
  }
}

template <class T>
void sparse_mla_backward(T* dq, T* dkv, const T* dout, const T* q, const T* kv, const int32_t* idx, const T* o,
                         const acc_t<T>* lse, const SparseMlaParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  // dkv of one batch element collects every query's contributions in acc_t and is stored once,
  // so bf16 rounds once per element and never-selected rows stay exactly 0.
  std::vector<A> dkv_acc(size_t(d.Skv * d.Dqk)), dq_acc(size_t(d.Dqk));
  for (int64_t b = 0; b < d.B; ++b) {
    std::fill(dkv_acc.begin(), dkv_acc.end(), A(0));
    for (int64_t t = 0; t < d.S; ++t) {
      const int32_t* sel = idx + (b * d.S + t) * d.K;
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        const T* qh = q + row * d.Dqk;
        const T* doh = dout + row * d.Dv;
        // Delta = rowsum(dO * O): the softmax backward's sum_i P_i dA_i, without a second pass.
        const A delta = dot<A>(doh, o + row * d.Dv, d.Dv);
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        for (int64_t i = 0; i < d.K; ++i) {
          if (!sparse_mla_slot_valid(sel[i], t, d)) continue;  // also every slot of an empty row
          const T* r = kv + (b * d.Skv + sel[i]) * d.Dqk;
          const A p = std::exp(scale * dot<A>(qh, r, d.Dqk) - lse[row]);
          const A ds = scale * p * (dot<A>(doh, r, d.Dv) - delta);  // dScore, with the scale folded in
          A* g = dkv_acc.data() + sel[i] * d.Dqk;
          for (int64_t c = 0; c < d.Dqk; ++c) {
            dq_acc[size_t(c)] += ds * A(load(r[c]));
            g[c] += ds * A(load(qh[c]));  // key role: all Dqk dims
          }
          for (int64_t c = 0; c < d.Dv; ++c) g[c] += p * A(load(doh[c]));  // value role: first Dv dims
        }
        for (int64_t c = 0; c < d.Dqk; ++c) dq[row * d.Dqk + c] = store<T>(dq_acc[size_t(c)]);
      }
    }
    for (int64_t e = 0; e < d.Skv * d.Dqk; ++e) dkv[b * d.Skv * d.Dqk + e] = store<T>(dkv_acc[size_t(e)]);
  }
}

#define TITAN_INSTANTIATE(T)                                                                                  \
  template void sparse_mla_forward<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const int32_t*,           \
                                      const SparseMlaParams&);                                                \
  template void sparse_mla_backward<T>(T*, T*, const T*, const T*, const T*, const int32_t*, const T*,        \
                                       const acc_t<T>*, const SparseMlaParams&);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
