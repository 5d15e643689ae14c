// mHC's per-token maps (DeepSeek-V4's hyper-connections; ../shared/reference/v4_transformers.md
// section 2), plain loops in any floating type: the reference the gradient checks run in double
// and the tensor-level kernels (kernels/hyper_connection.h) run in f32 over token ranges.
//
// Per token, with N streams of width d and M = (N + 2) N mixes (mix = fn x_hat, computed by a GEMM):
//   weights:  pre_j  = sigmoid(mix_j s0 + b_j) + eps                     j < N
//             post_k = 2 sigmoid(mix_{N+k} s1 + b_{N+k})                 k < N
//             L_i    = mix_{2N+i} s2 + b_{2N+i}                          i < N^2 (row-major [j, k]);
//             P = Sinkhorn(L) (kernels/sinkhorn.h)
//   collapse: u = sum_j pre_j X_j                                        X [N, d] -> u [d]
//   expand:   Y_k = post_k a + sum_j P[j, k] X_j                        (P applied transposed)
// Backward functions add (+=) into every gradient pointer that is not null.
#pragma once

#include <cmath>
#include <cstdint>

namespace titan::kernels::ref {

template <class T>
T hc_sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

// mix [tokens, m], base [m], scale [3] -> w [tokens, m] packed as mix is: pre (N), post (N),
// then the Sinkhorn logits L (N^2); m = (N + 2) N. The HyperHead's m = N has pre only (scale [1]).
template <class T>
void hc_weights_forward(T* w, const T* mix, const T* base, const T* scale, int64_t tokens, int64_t m, int64_t n,
                        double eps) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < m; ++i) {
      const int g = i < n ? 0 : i < 2 * n ? 1 : 2;
      const T z = mix[t * m + i] * scale[g] + base[i];
      w[t * m + i] = g == 0 ? hc_sigmoid(z) + T(eps) : g == 1 ? T(2) * hc_sigmoid(z) : z;
    }
}

// The gradients of mix [tokens, m], base [m] and scale from dw [tokens, m].
template <class T>
void hc_weights_backward(T* dmix, T* dbase, T* dscale, const T* dw, const T* mix, const T* base, const T* scale,
                         int64_t tokens, int64_t m, int64_t n) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < m; ++i) {
      const int g = i < n ? 0 : i < 2 * n ? 1 : 2;
      const T x = mix[t * m + i];
      T dz = dw[t * m + i];  // becomes the gradient of the pre-activation z = x s_g + b
      if (g < 2) {
        const T s = hc_sigmoid(x * scale[g] + base[i]);
        dz *= (g == 0 ? T(1) : T(2)) * s * (T(1) - s);
      }
      if (dmix) dmix[t * m + i] += dz * scale[g];
      if (dbase) dbase[i] += dz;
      if (dscale) dscale[g] += dz * x;
    }
}

// x [tokens, N, d], pre [tokens, N] -> u [tokens, d].
template <class T>
void hc_collapse_forward(T* u, const T* x, const T* pre, int64_t tokens, int64_t n, int64_t d) {
  for (int64_t t = 0; t < tokens; ++t) {
    T* ut = u + t * d;
    for (int64_t c = 0; c < d; ++c) ut[c] = T(0);
    for (int64_t j = 0; j < n; ++j) {
      const T w = pre[t * n + j];
      const T* xj = x + (t * n + j) * d;
      for (int64_t c = 0; c < d; ++c) ut[c] += w * xj[c];
    }
  }
}

template <class T>
void hc_collapse_backward(T* dx, T* dpre, const T* du, const T* x, const T* pre, int64_t tokens, int64_t n, int64_t d) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* dut = du + t * d;
    for (int64_t j = 0; j < n; ++j) {
      const T* xj = x + (t * n + j) * d;
      if (dpre) {
        T dot = T(0);
        for (int64_t c = 0; c < d; ++c) dot += dut[c] * xj[c];
        dpre[t * n + j] += dot;
      }
      if (dx) {
        const T w = pre[t * n + j];
        T* dxj = dx + (t * n + j) * d;
        for (int64_t c = 0; c < d; ++c) dxj[c] += w * dut[c];
      }
    }
  }
}

// x [tokens, N, d], a [tokens, d], post [tokens, N], comb [tokens, N, N] -> y [tokens, N, d].
template <class T>
void hc_expand_forward(T* y, const T* x, const T* a, const T* post, const T* comb, int64_t tokens, int64_t n,
                       int64_t d) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* at = a + t * d;
    for (int64_t k = 0; k < n; ++k) {
      T* yk = y + (t * n + k) * d;
      const T p = post[t * n + k];
      for (int64_t c = 0; c < d; ++c) yk[c] = p * at[c];
      for (int64_t j = 0; j < n; ++j) {
        const T w = comb[(t * n + j) * n + k];
        const T* xj = x + (t * n + j) * d;
        for (int64_t c = 0; c < d; ++c) yk[c] += w * xj[c];
      }
    }
  }
}

template <class T>
void hc_expand_backward(T* dx, T* da, T* dpost, T* dcomb, const T* dy, const T* x, const T* a, const T* post,
                        const T* comb, int64_t tokens, int64_t n, int64_t d) {
  for (int64_t t = 0; t < tokens; ++t) {
    const T* at = a + t * d;
    for (int64_t k = 0; k < n; ++k) {
      const T* dyk = dy + (t * n + k) * d;
      if (dpost) {
        T dot = T(0);
        for (int64_t c = 0; c < d; ++c) dot += dyk[c] * at[c];
        dpost[t * n + k] += dot;
      }
      if (da) {
        const T p = post[t * n + k];
        T* dat = da + t * d;
        for (int64_t c = 0; c < d; ++c) dat[c] += p * dyk[c];
      }
      for (int64_t j = 0; j < n; ++j) {
        const T* xj = x + (t * n + j) * d;
        if (dcomb) {
          T dot = T(0);
          for (int64_t c = 0; c < d; ++c) dot += xj[c] * dyk[c];
          dcomb[(t * n + j) * n + k] += dot;
        }
        if (dx) {
          const T w = comb[(t * n + j) * n + k];
          T* dxj = dx + (t * n + j) * d;
          for (int64_t c = 0; c < d; ++c) dxj[c] += w * dyk[c];
        }
      }
    }
  }
}

}  // namespace titan::kernels::ref
