#include "titan/kernels/ref/v4_attention.h"

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

// The keys query (b, t) sees, as row indices into [kv rows of b | comp rows of b] (raw key row j
// is j, entry w is Skv + w): its window, then its visible entries (HCA) or valid slots (CSA).
void visible_keys(std::vector<int64_t>& keys, int64_t b, int64_t t, const int32_t* idx, const V4AttentionParams& d) {
  keys.clear();
  for (int64_t j = v4_window_start(d, t); j <= v4_self_row(d, t); ++j) keys.push_back(j);
  if (!idx) {
    for (int64_t w = 0; w < v4_visible_entries(d, t); ++w) keys.push_back(d.Skv + w);
    return;
  }
  const int32_t* sel = idx + (b * d.S + t) * d.K;
  for (int64_t i = 0; i < d.K; ++i) {
    if (v4_slot_valid(d, sel[i], t)) keys.push_back(d.Skv + sel[i]);
  }
}

template <class T>
const T* key_row(int64_t key, int64_t b, const T* kv, const T* comp, const V4AttentionParams& d) {
  return key < d.Skv ? kv + (b * d.Skv + key) * d.D : comp + (b * d.T + key - d.Skv) * d.D;
}

// hm[i] += (1/H) softmax over the valid slots of one head's scores, for each valid slot i of sel.
// scores are the head's scores in visible_keys' order (its window first, then the valid slots).
template <class A>
void add_slot_probabilities(A* hm, const std::vector<A>& scores, const int32_t* sel, int64_t t,
                            const V4AttentionParams& d) {
  const size_t first = size_t(v4_self_row(d, t) - v4_window_start(d, t) + 1);
  if (scores.size() == first) return;  // no valid slot
  const A m = *std::max_element(scores.begin() + std::ptrdiff_t(first), scores.end());
  A l = 0;
  for (size_t j = first; j < scores.size(); ++j) l += std::exp(scores[j] - m);
  size_t j = first;
  for (int64_t i = 0; i < d.K; ++i) {
    if (v4_slot_valid(d, sel[i], t)) hm[i] += std::exp(scores[j++] - m) / l / A(d.H);
  }
}

}  // namespace

template <class T>
void v4_attention_forward(T* o, acc_t<T>* lse, acc_t<T>* head_mean, const T* q, const T* kv, const T* comp,
                          const int32_t* idx, const acc_t<T>* sink, const V4AttentionParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  std::vector<int64_t> keys;
  std::vector<A> scores, acc(size_t(d.D));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      visible_keys(keys, b, t, idx, d);
      scores.resize(keys.size());
      if (head_mean) std::fill(head_mean + (b * d.S + t) * d.K, head_mean + (b * d.S + t + 1) * d.K, A(0));
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        const T* qh = q + row * d.D;
        const A s_h = sink ? sink[h] : -std::numeric_limits<A>::infinity();
        A m = s_h;
        for (size_t i = 0; i < keys.size(); ++i) {
          scores[i] = scale * dot<A>(qh, key_row(keys[i], b, kv, comp, d), d.D);
          m = std::max(m, scores[i]);
        }
        A l = sink ? std::exp(s_h - m) : A(0);
        for (size_t i = 0; i < keys.size(); ++i) l += std::exp(scores[i] - m);
        lse[row] = m + std::log(l);
        std::fill(acc.begin(), acc.end(), A(0));
        for (size_t i = 0; i < keys.size(); ++i) {
          const A p = std::exp(scores[i] - lse[row]);
          const T* v = key_row(keys[i], b, kv, comp, d);
          for (int64_t c = 0; c < d.D; ++c) acc[size_t(c)] += p * A(load(v[c]));
        }
        for (int64_t c = 0; c < d.D; ++c) o[row * d.D + c] = store<T>(acc[size_t(c)]);
        if (head_mean && idx)
          add_slot_probabilities(head_mean + (b * d.S + t) * d.K, scores, idx + (b * d.S + t) * d.K, t, d);
      }
    }
  }
}

template <class T>
void v4_attention_backward(T* dq, T* dkv, T* dcomp, acc_t<T>* dsink, const T* dout, const T* q, const T* kv,
                           const T* comp, const int32_t* idx, const acc_t<T>* sink, const T* o, const acc_t<T>* lse,
                           const V4AttentionParams& d) {
  using A = acc_t<T>;
  const A scale = A(d.scale);
  // The key rows of one batch element ([kv | comp]) collect every query's key- and value-role
  // contributions in acc_t and are stored once.
  std::vector<A> dkey(size_t((d.Skv + d.T) * d.D)), dq_acc(size_t(d.D)), dsink_acc(size_t(d.H), A(0));
  std::vector<int64_t> keys;
  for (int64_t b = 0; b < d.B; ++b) {
    std::fill(dkey.begin(), dkey.end(), A(0));
    for (int64_t t = 0; t < d.S; ++t) {
      visible_keys(keys, b, t, idx, d);
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t row = (b * d.S + t) * d.H + h;
        const T* qh = q + row * d.D;
        const T* doh = dout + row * d.D;
        // Delta = rowsum(dO * O) = sum_j p_j dA_j over the keys; the sink has no value (dA = 0).
        const A delta = dot<A>(doh, o + row * d.D, d.D);
        if (sink) dsink_acc[size_t(h)] -= std::exp(sink[h] - lse[row]) * delta;
        std::fill(dq_acc.begin(), dq_acc.end(), A(0));
        for (const int64_t key : keys) {
          const T* r = key_row(key, b, kv, comp, d);
          const A p = std::exp(scale * dot<A>(qh, r, d.D) - lse[row]);
          const A ds = scale * p * (dot<A>(doh, r, d.D) - delta);  // dScore with the scale folded in
          A* g = dkey.data() + key * d.D;
          for (int64_t c = 0; c < d.D; ++c) {
            dq_acc[size_t(c)] += ds * A(load(r[c]));
            g[c] += ds * A(load(qh[c])) + p * A(load(doh[c]));  // key role + value role
          }
        }
        for (int64_t c = 0; c < d.D; ++c) dq[row * d.D + c] = store<T>(dq_acc[size_t(c)]);
      }
    }
    for (int64_t e = 0; e < d.Skv * d.D; ++e) dkv[b * d.Skv * d.D + e] = store<T>(dkey[size_t(e)]);
    for (int64_t e = 0; e < d.T * d.D; ++e) dcomp[b * d.T * d.D + e] = store<T>(dkey[size_t(d.Skv * d.D + e)]);
  }
  if (sink)
    for (int64_t h = 0; h < d.H; ++h) dsink[h] = dsink_acc[size_t(h)];
}

#define TITAN_INSTANTIATE(T)                                                                                     \
  template void v4_attention_forward<T>(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, const int32_t*,  \
                                        const acc_t<T>*, const V4AttentionParams&);                              \
  template void v4_attention_backward<T>(T*, T*, T*, acc_t<T>*, const T*, const T*, const T*, const T*,          \
                                         const int32_t*, const acc_t<T>*, const T*, const acc_t<T>*,             \
                                         const V4AttentionParams&);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
