#include "titan/kernels/hyper_connection.h"

#include <string>

#include "titan/core/error.h"
#include "titan/core/parallel.h"
#include "titan/kernels/ref/hyper_connection.h"

namespace titan::kernels {

namespace {

// Checks that t is f32, contiguous and of `shape` (an undefined t passes when it may be absent).
void check(const Tensor& t, const Shape& shape, const char* op, const char* name, bool optional = false) {
  if (optional && !t.defined()) return;
  TITAN_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.shape() == shape,
              std::string(op) + ": " + name + " must be f32 contiguous " + shape.str() + ", got " +
                  (t.defined() ? t.str() : std::string("undefined")));
}

float* data_or_null(Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

// Streams N and width d of x [T, N, d].
struct Streams {
  int64_t tokens, n, d;
};
Streams streams_of(const Tensor& x, const char* op) {
  TITAN_CHECK(x.dim() == 3, std::string(op) + ": x must be [T, N, d], got " + x.str());
  return {x.size(0), x.size(1), x.size(2)};
}

// The mixes' count m of mix [T, m]: (N + 2) N (a hyper-connection, scale [3]) or N (the head, scale [1]).
int64_t weights_width(const Tensor& mix, int64_t n, const char* op) {
  const int64_t m = mix.dim() == 2 ? mix.size(1) : -1;
  TITAN_CHECK(n >= 1 && (m == (n + 2) * n || m == n),
              std::string(op) + ": mix must be [T, (N + 2) N] or [T, N] with N = " + std::to_string(n) + ", got " +
                  mix.str());
  return m;
}

constexpr int64_t kTokenGrain = 64;

}  // namespace

void hc_weights_forward(Tensor& w, const Tensor& mix, const Tensor& base, const Tensor& scale, int64_t n, double eps) {
  const int64_t m = weights_width(mix, n, "hc_weights_forward"), tokens = mix.size(0);
  for (const auto& [t, name] : {std::pair{&mix, "mix"}, {&w, "w"}}) check(*t, {tokens, m}, "hc_weights_forward", name);
  check(base, {m}, "hc_weights_forward", "base");
  check(scale, {m == n ? 1 : 3}, "hc_weights_forward", "scale");
  const float *mp = mix.data<float>(), *bp = base.data<float>(), *sp = scale.data<float>();
  float* wp = w.data<float>();
  parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
    ref::hc_weights_forward<float>(wp + lo * m, mp + lo * m, bp, sp, hi - lo, m, n, eps);
  });
}

void hc_weights_backward(Tensor& dmix, Tensor& dbase, Tensor& dscale, const Tensor& dw, const Tensor& mix,
                         const Tensor& base, const Tensor& scale, int64_t n) {
  const int64_t m = weights_width(mix, n, "hc_weights_backward"), tokens = mix.size(0);
  const int64_t scales = m == n ? 1 : 3;
  check(mix, {tokens, m}, "hc_weights_backward", "mix");
  check(dw, {tokens, m}, "hc_weights_backward", "dw");
  check(dmix, {tokens, m}, "hc_weights_backward", "dmix", true);
  check(base, {m}, "hc_weights_backward", "base");
  check(dbase, {m}, "hc_weights_backward", "dbase", true);
  check(scale, {scales}, "hc_weights_backward", "scale");
  check(dscale, {scales}, "hc_weights_backward", "dscale", true);
  const float *dwp = dw.data<float>(), *mp = mix.data<float>(), *bp = base.data<float>(), *sp = scale.data<float>();
  if (float* dm = data_or_null(dmix))
    parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
      ref::hc_weights_backward<float>(dm + lo * m, nullptr, nullptr, dwp + lo * m, mp + lo * m, bp, sp, hi - lo, m, n);
    });
  // The sums over tokens: m + 3 values, one pass in token order (deterministic).
  if (dbase.defined() || dscale.defined())
    ref::hc_weights_backward<float>(nullptr, data_or_null(dbase), data_or_null(dscale), dwp, mp, bp, sp, tokens, m, n);
}

void hc_collapse_forward(Tensor& u, const Tensor& x, const Tensor& pre) {
  const auto [tokens, n, d] = streams_of(x, "hc_collapse_forward");
  check(x, {tokens, n, d}, "hc_collapse_forward", "x");
  check(pre, {tokens, n}, "hc_collapse_forward", "pre");
  check(u, {tokens, d}, "hc_collapse_forward", "u");
  const float *xp = x.data<float>(), *pp = pre.data<float>();
  float* up = u.data<float>();
  parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
    ref::hc_collapse_forward<float>(up + lo * d, xp + lo * n * d, pp + lo * n, hi - lo, n, d);
  });
}

void hc_collapse_backward(Tensor& dx, Tensor& dpre, const Tensor& du, const Tensor& x, const Tensor& pre) {
  const auto [tokens, n, d] = streams_of(x, "hc_collapse_backward");
  check(x, {tokens, n, d}, "hc_collapse_backward", "x");
  check(dx, {tokens, n, d}, "hc_collapse_backward", "dx", true);
  check(pre, {tokens, n}, "hc_collapse_backward", "pre");
  check(dpre, {tokens, n}, "hc_collapse_backward", "dpre", true);
  check(du, {tokens, d}, "hc_collapse_backward", "du");
  float *dxp = data_or_null(dx), *dpp = data_or_null(dpre);
  const float *dup = du.data<float>(), *xp = x.data<float>(), *pp = pre.data<float>();
  parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
    ref::hc_collapse_backward<float>(dxp ? dxp + lo * n * d : nullptr, dpp ? dpp + lo * n : nullptr, dup + lo * d,
                                     xp + lo * n * d, pp + lo * n, hi - lo, n, d);
  });
}

void hc_expand_forward(Tensor& y, const Tensor& x, const Tensor& a, const Tensor& post, const Tensor& comb) {
  const auto [tokens, n, d] = streams_of(x, "hc_expand_forward");
  check(x, {tokens, n, d}, "hc_expand_forward", "x");
  check(y, {tokens, n, d}, "hc_expand_forward", "y");
  check(a, {tokens, d}, "hc_expand_forward", "a");
  check(post, {tokens, n}, "hc_expand_forward", "post");
  check(comb, {tokens, n, n}, "hc_expand_forward", "comb");
  const float *xp = x.data<float>(), *ap = a.data<float>(), *pp = post.data<float>(), *cp = comb.data<float>();
  float* yp = y.data<float>();
  parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
    ref::hc_expand_forward<float>(yp + lo * n * d, xp + lo * n * d, ap + lo * d, pp + lo * n, cp + lo * n * n, hi - lo,
                                  n, d);
  });
}

void hc_expand_backward(Tensor& dx, Tensor& da, Tensor& dpost, Tensor& dcomb, const Tensor& dy, const Tensor& x,
                        const Tensor& a, const Tensor& post, const Tensor& comb) {
  const auto [tokens, n, d] = streams_of(x, "hc_expand_backward");
  check(x, {tokens, n, d}, "hc_expand_backward", "x");
  check(dy, {tokens, n, d}, "hc_expand_backward", "dy");
  check(dx, {tokens, n, d}, "hc_expand_backward", "dx", true);
  check(a, {tokens, d}, "hc_expand_backward", "a");
  check(da, {tokens, d}, "hc_expand_backward", "da", true);
  check(post, {tokens, n}, "hc_expand_backward", "post");
  check(dpost, {tokens, n}, "hc_expand_backward", "dpost", true);
  check(comb, {tokens, n, n}, "hc_expand_backward", "comb");
  check(dcomb, {tokens, n, n}, "hc_expand_backward", "dcomb", true);
  float *dxp = data_or_null(dx), *dap = data_or_null(da), *dpp = data_or_null(dpost), *dcp = data_or_null(dcomb);
  const float *dyp = dy.data<float>(), *xp = x.data<float>(), *ap = a.data<float>(), *pp = post.data<float>(),
              *cp = comb.data<float>();
  parallel_for(0, tokens, kTokenGrain, [&](int64_t lo, int64_t hi) {
    ref::hc_expand_backward<float>(dxp ? dxp + lo * n * d : nullptr, dap ? dap + lo * d : nullptr,
                                   dpp ? dpp + lo * n : nullptr, dcp ? dcp + lo * n * n : nullptr, dyp + lo * n * d,
                                   xp + lo * n * d, ap + lo * d, pp + lo * n, cp + lo * n * n, hi - lo, n, d);
  });
}

}  // namespace titan::kernels
