#include "titan/kernels/ref/lightning_indexer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace titan::kernels::ref {

namespace {

// I(t, s) of one query row; dots [HI] receives q[t, j] . k[s] for the gradient.
template <class T>
acc_t<T> index_score(acc_t<T>* dots, const T* qt, const T* ks, const acc_t<T>* wt, const IndexerParams& d) {
  acc_t<T> score = 0;
  for (int64_t j = 0; j < d.HI; ++j) {
    acc_t<T> dot = 0;
    for (int64_t c = 0; c < d.DI; ++c) dot += load(qt[j * d.DI + c]) * load(ks[c]);
    dots[j] = dot;
    score += wt[j] * std::max<acc_t<T>>(dot, 0);
  }
  return score;
}

// Ranking of ref/topk.h: true when a ranks above b. NaN above everything, then by value (so
// -0 == +0), then the lower key index.
template <class A>
bool ranks_above(A va, int32_t ia, A vb, int32_t ib) {
  const bool na = std::isnan(va), nb = std::isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

}  // namespace

template <class T>
void indexer_topk(int32_t* idx, const T* q, const T* k, const acc_t<T>* w, const IndexerParams& d) {
  using A = acc_t<T>;
  std::vector<A> scores(size_t(d.Skv)), dots(size_t(d.HI));
  std::vector<int32_t> order(size_t(d.Skv));
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      const int64_t row = b * d.S + t, n = valid_keys(d, t);
      for (int64_t s = 0; s < n; ++s) {
        scores[size_t(s)] = index_score(dots.data(), q + row * d.HI * d.DI, k + (b * d.Skv + s) * d.DI,
                                        w + row * d.HI, d);
        order[size_t(s)] = int32_t(s);
      }
      const int64_t take = std::min(n, d.K);
      std::sort(order.begin(), order.begin() + n, [&](int32_t a, int32_t c) {
        return ranks_above(scores[size_t(a)], a, scores[size_t(c)], c);
      });
      std::sort(order.begin(), order.begin() + take);
      int32_t* out = idx + row * d.K;
      for (int64_t i = 0; i < d.K; ++i) out[i] = i < take ? order[size_t(i)] : -1;
    }
  }
}

namespace {

// Per-row state and buffers of the KL loss, shared by the dense/recomputing and the given-target
// variants: one query row's loss over its set V_t = keys[0, n) with target p[0, n).
template <class T>
struct KlRows {
  using A = acc_t<T>;
  const IndexerParams& d;
  std::vector<A> dk_acc;  // [B, Skv, DI], rounded to T at the end
  std::vector<int32_t> keys;
  std::vector<int64_t> pos;  // position of a key in keys, -1 when not listed (V_t is a set)
  std::vector<A> dots, score, target, dq_acc;
  double loss = 0;

  explicit KlRows(const IndexerParams& dims)
      : d(dims), dk_acc(size_t(d.B * d.Skv * d.DI), A(0)), keys(size_t(d.Skv)), pos(size_t(d.Skv), -1),
        dq_acc(size_t(d.HI * d.DI)) {}

  // V_t of row (b, t) = the valid entries of its idx row, each key once (in first-slot order);
  // slot_target (optional) gives each key the sum of its slots' targets. Returns n.
  int64_t select(const int32_t* sel, const A* slot_target, int64_t t) {
    const int64_t n_valid = valid_keys(d, t);
    int64_t n = 0;
    target.assign(size_t(d.K), A(0));
    for (int64_t i = 0; i < d.K; ++i) {
      const int32_t s = sel[i];
      if (s < 0 || s >= n_valid) continue;
      if (pos[size_t(s)] < 0) pos[size_t(s)] = n, keys[size_t(n++)] = s;
      if (slot_target) target[size_t(pos[size_t(s)])] += slot_target[i];
    }
    for (int64_t i = 0; i < n; ++i) pos[size_t(keys[size_t(i)])] = -1;
    return n;
  }

  // The index scores of row (b, t) over keys[0, n) into score, with their lse; dots [n, HI].
  A scores(const T* k, const T* qt, const A* wt, int64_t b, int64_t n) {
    dots.assign(size_t(n * d.HI), A(0));
    score.assign(size_t(n), A(0));
    A max_score = -std::numeric_limits<A>::infinity();
    for (int64_t i = 0; i < n; ++i) {
      score[size_t(i)] = index_score(&dots[size_t(i * d.HI)], qt, k + (b * d.Skv + keys[size_t(i)]) * d.DI, wt, d);
      max_score = std::max(max_score, score[size_t(i)]);
    }
    A sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(score[size_t(i)] - max_score);
    return max_score + std::log(sum);
  }

  // Adds the row's KL(target || softmax(score)) to loss and writes its dq and dw rows, adding its
  // dk contributions: g = grad_scale * (softmax(I) - p) (docs/dsa.md 6.4), ReLU'(0) = 0.
  void loss_and_grad(T* dq, A* dwt, const T* k, const T* qt, const A* wt, int64_t b, int64_t row, int64_t n, A lse,
                     double grad_scale) {
    for (int64_t j = 0; j < d.HI; ++j) dwt[j] = 0;
    std::fill(dq_acc.begin(), dq_acc.end(), A(0));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t s = keys[size_t(i)];
      const A log_q = score[size_t(i)] - lse, p = target[size_t(i)];
      if (p > 0) loss += double(p) * (std::log(double(p)) - double(log_q));
      const A g = A(grad_scale) * (std::exp(log_q) - p);
      const T* ks = k + (b * d.Skv + s) * d.DI;
      A* dks = &dk_acc[size_t((b * d.Skv + s) * d.DI)];
      for (int64_t j = 0; j < d.HI; ++j) {
        const A dot = dots[size_t(i * d.HI + j)];
        if (dot <= 0) continue;
        dwt[j] += g * dot;
        const A gw = g * wt[j];
        for (int64_t c = 0; c < d.DI; ++c) {
          dq_acc[size_t(j * d.DI + c)] += gw * load(ks[c]);
          dks[c] += gw * load(qt[j * d.DI + c]);
        }
      }
    }
    for (int64_t c = 0; c < d.HI * d.DI; ++c) dq[row * d.HI * d.DI + c] = store<T>(dq_acc[size_t(c)]);
  }

  void store_dk(T* dk) const {
    for (size_t c = 0; c < dk_acc.size(); ++c) dk[c] = store<T>(dk_acc[c]);
  }
};

}  // namespace

template <class T>
double indexer_kl_loss(T* dq, T* dk, acc_t<T>* dw, const T* q, const T* k, const acc_t<T>* w, const T* mq,
                       const T* mk, const acc_t<T>* mlse, const int32_t* idx, const IndexerParams& d,
                       const IndexerTargetParams& td, double grad_scale) {
  using A = acc_t<T>;
  const int64_t group = td.H / td.Hk;
  KlRows<T> r(d);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      const int64_t row = b * d.S + t;
      // V_t: every valid key (dense stage) or the valid entries of idx[t] (sparse stage).
      int64_t n = 0;
      if (idx == nullptr) {
        for (int64_t s = 0; s < valid_keys(d, t); ++s) r.keys[size_t(n++)] = int32_t(s);
      } else {
        n = r.select(idx + row * d.K, nullptr, t);
      }
      const T* qt = q + row * d.HI * d.DI;
      const A* wt = w + row * d.HI;
      const A lse = r.scores(k, qt, wt, b, n);
      // Target: the head mean of the main attention's probabilities, from its saved lse.
      r.target.assign(size_t(n), A(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s = r.keys[size_t(i)];
        A p = 0;
        for (int64_t h = 0; h < td.H; ++h) {
          const T* mqh = mq + (row * td.H + h) * td.D;
          const T* mks = mk + ((b * d.Skv + s) * td.Hk + h / group) * td.D;
          A dot = 0;
          for (int64_t c = 0; c < td.D; ++c) dot += load(mqh[c]) * load(mks[c]);
          p += std::exp(A(td.scale) * dot - mlse[row * td.H + h]);
        }
        r.target[size_t(i)] = p / A(td.H);
      }
      r.loss_and_grad(dq, dw + row * d.HI, k, qt, wt, b, row, n, lse, grad_scale);
    }
  }
  r.store_dk(dk);
  return r.loss;
}

template <class T>
double indexer_kl_loss_sparse(T* dq, T* dk, acc_t<T>* dw, const T* q, const T* k, const acc_t<T>* w,
                              const int32_t* idx, const acc_t<T>* target, const IndexerParams& d, double grad_scale) {
  using A = acc_t<T>;
  KlRows<T> r(d);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t t = 0; t < d.S; ++t) {
      const int64_t row = b * d.S + t;
      const int64_t n = r.select(idx + row * d.K, target + row * d.K, t);
      const T* qt = q + row * d.HI * d.DI;
      const A* wt = w + row * d.HI;
      const A lse = r.scores(k, qt, wt, b, n);
      r.loss_and_grad(dq, dw + row * d.HI, k, qt, wt, b, row, n, lse, grad_scale);
    }
  }
  r.store_dk(dk);
  return r.loss;
}

template <class T>
void hadamard_transform(T* x, int64_t rows, int64_t n) {
  using A = acc_t<T>;
  std::vector<A> y(static_cast<size_t>(n));
  const A norm = A(1) / std::sqrt(A(n));
  for (int64_t r = 0; r < rows; ++r) {
    T* xr = x + r * n;
    for (int64_t j = 0; j < n; ++j) {
      A acc = 0;
      for (int64_t i = 0; i < n; ++i) {
        const A v = load(xr[i]);
        acc += (std::popcount(uint64_t(i & j)) & 1) ? -v : v;
      }
      y[size_t(j)] = acc * norm;
    }
    for (int64_t j = 0; j < n; ++j) xr[j] = store<T>(y[size_t(j)]);
  }
}

#define TITAN_LI_INSTANTIATE(T)                                                                                   \
  template void indexer_topk<T>(int32_t*, const T*, const T*, const acc_t<T>*, const IndexerParams&);             \
  template double indexer_kl_loss<T>(T*, T*, acc_t<T>*, const T*, const T*, const acc_t<T>*, const T*, const T*,  \
                                     const acc_t<T>*, const int32_t*, const IndexerParams&,                       \
                                     const IndexerTargetParams&, double);                                         \
  template double indexer_kl_loss_sparse<T>(T*, T*, acc_t<T>*, const T*, const T*, const acc_t<T>*,               \
                                            const int32_t*, const acc_t<T>*, const IndexerParams&, double);       \
  template void hadamard_transform<T>(T*, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_LI_INSTANTIATE)
#undef TITAN_LI_INSTANTIATE

}  // namespace titan::kernels::ref
