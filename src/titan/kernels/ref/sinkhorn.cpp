#include "titan/kernels/ref/sinkhorn.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace titan::kernels::ref {

namespace {

// One token's forward with every intermediate kept: q the softmax, steps[i] the output of
// normalisation i (2 * iters - 1 of them, columns at even i) and sums[i] its axis sums.
template <class T>
struct Trace {
  std::vector<T> q;
  std::vector<std::vector<T>> steps, sums;
};

template <class T>
Trace<T> trace(const T* l, int64_t n, int iters, T eps) {
  Trace<T> t;
  t.q.resize(size_t(n * n));
  for (int64_t j = 0; j < n; ++j) {
    T m = l[j * n];
    for (int64_t k = 1; k < n; ++k) m = std::max(m, l[j * n + k]);
    T s = 0;
    for (int64_t k = 0; k < n; ++k) s += std::exp(l[j * n + k] - m);
    for (int64_t k = 0; k < n; ++k) t.q[size_t(j * n + k)] = std::exp(l[j * n + k] - m) / s;
  }
  std::vector<T> z = t.q;
  for (T& v : z) v += eps;
  for (int i = 0; i < 2 * iters - 1; ++i) {
    const bool columns = i % 2 == 0;
    std::vector<T> s(size_t(n), 0);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < n; ++k) s[size_t(columns ? k : j)] += z[size_t(j * n + k)];
    for (int64_t j = 0; j < n; ++j)
      for (int64_t k = 0; k < n; ++k) z[size_t(j * n + k)] /= s[size_t(columns ? k : j)] + eps;
    t.steps.push_back(z);
    t.sums.push_back(s);
  }
  return t;
}

}  // namespace

template <class T>
void sinkhorn_forward(T* p, const T* logits, int64_t tokens, int64_t n, int iters, double eps) {
  for (int64_t t = 0; t < tokens; ++t) {
    const Trace<T> tr = trace(logits + t * n * n, n, iters, T(eps));
    std::copy(tr.steps.back().begin(), tr.steps.back().end(), p + t * n * n);
  }
}

template <class T>
void sinkhorn_backward(T* dlogits, const T* dp, const T* logits, int64_t tokens, int64_t n, int iters, double eps) {
  for (int64_t t = 0; t < tokens; ++t) {
    const Trace<T> tr = trace(logits + t * n * n, n, iters, T(eps));
    std::vector<T> dy(dp + t * n * n, dp + (t + 1) * n * n);
    for (int i = 2 * iters - 2; i >= 0; --i) {
      const bool columns = i % 2 == 0;
      const std::vector<T>& y = tr.steps[size_t(i)];
      std::vector<T> dot(size_t(n), 0);  // sum along the axis of dY * Y
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < n; ++k) dot[size_t(columns ? k : j)] += dy[size_t(j * n + k)] * y[size_t(j * n + k)];
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < n; ++k) {
          const size_t a = size_t(columns ? k : j);
          dy[size_t(j * n + k)] = (dy[size_t(j * n + k)] - dot[a]) / (tr.sums[size_t(i)][a] + T(eps));
        }
    }
    // dy is now dQ (the + eps passes it); the row softmax.
    T* dl = dlogits + t * n * n;
    for (int64_t j = 0; j < n; ++j) {
      T dot = 0;
      for (int64_t k = 0; k < n; ++k) dot += dy[size_t(j * n + k)] * tr.q[size_t(j * n + k)];
      for (int64_t k = 0; k < n; ++k) dl[j * n + k] += tr.q[size_t(j * n + k)] * (dy[size_t(j * n + k)] - dot);
    }
  }
}

template void sinkhorn_forward<float>(float*, const float*, int64_t, int64_t, int, double);
template void sinkhorn_forward<double>(double*, const double*, int64_t, int64_t, int, double);
template void sinkhorn_backward<float>(float*, const float*, const float*, int64_t, int64_t, int, double);
template void sinkhorn_backward<double>(double*, const double*, const double*, int64_t, int64_t, int, double);

}  // namespace titan::kernels::ref
