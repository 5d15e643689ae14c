#include "titan/kernels/ref/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace titan::kernels::ref {

namespace {

// The first `count` of `order` become the indices of the highest values, ties to the lower index.
template <class A>
void top_indices(std::vector<int32_t>& order, const std::vector<A>& values, int64_t count) {
  order.resize(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + count, order.end(), [&](int32_t a, int32_t b) {
    return values[size_t(a)] > values[size_t(b)] || (values[size_t(a)] == values[size_t(b)] && a < b);
  });
}

template <class T>
acc_t<T> selected_sum(const T* scores_row, const int32_t* idx_row, int64_t k) {
  acc_t<T> s = 0;
  for (int64_t j = 0; j < k; ++j) s += scores_row[idx_row[j]];
  return s;
}

constexpr double kNormEps = 1e-20;  // TorchTitan's guard for route_norm's division
constexpr double kSoftplusThreshold = 20;  // torch's softplus returns x itself above it

// One token's scores s [E] from its logits l [E].
template <class T>
void score_row(T* s, const T* l, int64_t e, RouterScore score) {
  using A = acc_t<T>;
  switch (score) {
    case RouterScore::softmax: {
      A mx = l[0], z = 0;
      for (int64_t i = 1; i < e; ++i) mx = std::max<A>(mx, l[i]);
      for (int64_t i = 0; i < e; ++i) z += std::exp(A(l[i]) - mx);
      for (int64_t i = 0; i < e; ++i) s[i] = T(std::exp(A(l[i]) - mx) / z);
      return;
    }
    case RouterScore::sigmoid:
      for (int64_t i = 0; i < e; ++i) s[i] = T(A(1) / (A(1) + std::exp(-A(l[i]))));
      return;
    case RouterScore::sqrtsoftplus:
      for (int64_t i = 0; i < e; ++i) {
        const A x = l[i];
        s[i] = T(std::sqrt(x > A(kSoftplusThreshold) ? x : std::log1p(std::exp(x))));
      }
      return;
  }
}

// d score / d logit of sqrt(softplus(x)) from the score s alone: softplus' derivative sigmoid(x)
// is 1 - e^-softplus(x) = -expm1(-s^2) (1 above the threshold, where softplus is x), over 2 s.
// s = 0 (softplus underflowed) is the limit e^(x/2) / 2 -> 0.
template <class A>
A sqrtsoftplus_slope(A s) {
  if (s <= A(0)) return A(0);
  const A sp = s * s;
  return (sp > A(kSoftplusThreshold) ? A(1) : -std::expm1(-sp)) / (A(2) * s);
}

// One token's weights w [k] from its scores s [E] and choice idx [k].
template <class T>
void weight_row(T* w, const T* s, const int32_t* idx, const RouterParams& p) {
  using A = acc_t<T>;
  const int64_t k = p.top_k;
  const A denom = p.route_norm ? selected_sum(s, idx, k) + A(kNormEps) : A(1);
  for (int64_t j = 0; j < k; ++j) w[j] = T(A(s[idx[j]]) / denom * A(p.route_scale));
}

}  // namespace

template <class T>
void router_forward(T* scores, int32_t* indices, T* weights, const T* logits, const T* bias, int64_t n,
                    const RouterParams& p) {
  using A = acc_t<T>;
  const int64_t e = p.experts, k = p.top_k, gs = p.group_size();
  std::vector<A> biased(static_cast<size_t>(e)), group_score(static_cast<size_t>(p.n_groups));
  std::vector<int32_t> order, group_order;
  for (int64_t t = 0; t < n; ++t) {
    T* s = scores + t * e;
    score_row(s, logits + t * e, e, p.score);
    for (int64_t i = 0; i < e; ++i) biased[size_t(i)] = A(s[i]) + (bias ? A(bias[i]) : A(0));
    if (p.topk_groups < p.n_groups) {
      // A group's score is the sum of its two best biased scores (its one score when alone).
      for (int64_t g = 0; g < p.n_groups; ++g) {
        A best = -std::numeric_limits<A>::infinity(), second = best;
        for (int64_t i = g * gs; i < (g + 1) * gs; ++i) {
          const A v = biased[size_t(i)];
          if (v > best) second = best, best = v;
          else if (v > second) second = v;
        }
        group_score[size_t(g)] = gs >= 2 ? best + second : best;
      }
      top_indices(group_order, group_score, p.topk_groups);
      std::vector<bool> keep(size_t(p.n_groups), false);
      for (int64_t g = 0; g < p.topk_groups; ++g) keep[size_t(group_order[size_t(g)])] = true;
      for (int64_t i = 0; i < e; ++i) {
        if (!keep[size_t(i / gs)]) biased[size_t(i)] = -std::numeric_limits<A>::infinity();
      }
    }
    top_indices(order, biased, k);
    int32_t* idx = indices + t * k;
    for (int64_t j = 0; j < k; ++j) idx[j] = order[size_t(j)];
    weight_row(weights + t * k, s, idx, p);
  }
}

template <class T>
void router_weights_forward(T* scores, T* weights, const T* logits, const int32_t* indices, int64_t n,
                            const RouterParams& p) {
  const int64_t e = p.experts, k = p.top_k;
  for (int64_t t = 0; t < n; ++t) {
    score_row(scores + t * e, logits + t * e, e, p.score);
    weight_row(weights + t * k, scores + t * e, indices + t * k, p);
  }
}

template <class T>
void router_backward(T* dlogits, const T* dweights, const T* dscores, const T* scores, const int32_t* indices,
                     int64_t n, const RouterParams& p) {
  using A = acc_t<T>;
  const int64_t e = p.experts, k = p.top_k;
  std::vector<A> ds(static_cast<size_t>(e));
  for (int64_t t = 0; t < n; ++t) {
    const T* s = scores + t * e;
    const int32_t* idx = indices + t * k;
    const T* dw = dweights + t * k;
    for (int64_t i = 0; i < e; ++i) ds[size_t(i)] = dscores ? A(dscores[t * e + i]) : A(0);
    // w_j = c s_j / z with z = sum of the selected scores (+ eps) when route_norm, else z = 1:
    // ds_m = c (dw_m / z - sum_j dw_j s_j / z^2) over the selected m.
    const A c = A(p.route_scale);
    if (p.route_norm) {
      const A z = selected_sum(s, idx, k) + A(kNormEps);
      A dot = 0;
      for (int64_t j = 0; j < k; ++j) dot += A(dw[j]) * A(s[idx[j]]);
      for (int64_t j = 0; j < k; ++j) ds[size_t(idx[j])] += c * (A(dw[j]) / z - dot / (z * z));
    } else {
      for (int64_t j = 0; j < k; ++j) ds[size_t(idx[j])] += c * A(dw[j]);
    }
    T* dl = dlogits + t * e;
    switch (p.score) {
      case RouterScore::softmax: {
        A dot = 0;  // dl_i = s_i (ds_i - sum_j ds_j s_j)
        for (int64_t i = 0; i < e; ++i) dot += ds[size_t(i)] * A(s[i]);
        for (int64_t i = 0; i < e; ++i) dl[i] = T(A(dl[i]) + A(s[i]) * (ds[size_t(i)] - dot));
        break;
      }
      case RouterScore::sigmoid:
        for (int64_t i = 0; i < e; ++i) dl[i] = T(A(dl[i]) + ds[size_t(i)] * A(s[i]) * (A(1) - A(s[i])));
        break;
      case RouterScore::sqrtsoftplus:
        for (int64_t i = 0; i < e; ++i) dl[i] = T(A(dl[i]) + ds[size_t(i)] * sqrtsoftplus_slope(A(s[i])));
        break;
    }
  }
}

template <class T>
acc_t<T> router_aux_loss(const T* scores, const int32_t* indices, int64_t batch, int64_t seq, const RouterParams& p) {
  using A = acc_t<T>;
  const int64_t e = p.experts, k = p.top_k;
  A total = 0;
  std::vector<A> f(static_cast<size_t>(e)), prob(static_cast<size_t>(e));
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(f.begin(), f.end(), A(0));
    std::fill(prob.begin(), prob.end(), A(0));
    for (int64_t t = b * seq; t < (b + 1) * seq; ++t) {
      const T* s = scores + t * e;
      A z = 0;
      for (int64_t i = 0; i < e; ++i) z += A(s[i]);
      for (int64_t i = 0; i < e; ++i) prob[size_t(i)] += A(s[i]) / z;
      for (int64_t j = 0; j < k; ++j) f[size_t(indices[t * k + j])] += A(1);
    }
    for (int64_t i = 0; i < e; ++i) total += f[size_t(i)] * A(e) / A(k * seq) * prob[size_t(i)] / A(seq);
  }
  return total / A(batch);
}

template <class T>
void router_aux_loss_backward(T* dscores, acc_t<T> dloss, const T* scores, const int32_t* indices, int64_t batch,
                              int64_t seq, const RouterParams& p) {
  using A = acc_t<T>;
  const int64_t e = p.experts, k = p.top_k;
  std::vector<A> f(static_cast<size_t>(e));
  for (int64_t b = 0; b < batch; ++b) {
    std::fill(f.begin(), f.end(), A(0));
    for (int64_t t = b * seq; t < (b + 1) * seq; ++t) {
      for (int64_t j = 0; j < k; ++j) f[size_t(indices[t * k + j])] += A(1);
    }
    // d loss / d s'_{t,i} = dloss f_i E / (k S) / S / batch, then through s' = s / z:
    // ds_j = (g_j - sum_i g_i s'_i) / z.
    const A unit = dloss * A(e) / A(k * seq) / A(seq) / A(batch);
    for (int64_t t = b * seq; t < (b + 1) * seq; ++t) {
      const T* s = scores + t * e;
      A z = 0, gs = 0;
      for (int64_t i = 0; i < e; ++i) z += A(s[i]);
      for (int64_t i = 0; i < e; ++i) gs += unit * f[size_t(i)] * A(s[i]) / z;
      for (int64_t i = 0; i < e; ++i) dscores[t * e + i] = T(A(dscores[t * e + i]) + (unit * f[size_t(i)] - gs) / z);
    }
  }
}

#define TITAN_INSTANTIATE(T)                                                                                   \
  template void router_forward<T>(T*, int32_t*, T*, const T*, const T*, int64_t, const RouterParams&);         \
  template void router_weights_forward<T>(T*, T*, const T*, const int32_t*, int64_t, const RouterParams&);     \
  template void router_backward<T>(T*, const T*, const T*, const T*, const int32_t*, int64_t, const RouterParams&); \
  template acc_t<T> router_aux_loss<T>(const T*, const int32_t*, int64_t, int64_t, const RouterParams&);       \
  template void router_aux_loss_backward<T>(T*, acc_t<T>, const T*, const int32_t*, int64_t, int64_t,         \
                                            const RouterParams&);
TITAN_INSTANTIATE(float)
TITAN_INSTANTIATE(double)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
