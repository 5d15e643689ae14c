#include "titan/kernels/attention_decode.h"

#include <cmath>
#include <vector>

#include "titan/core/parallel.h"
#include "titan/kernels/attention.h"

namespace titan::kernels {

void attention_decode(Tensor& o, const Tensor& q, const Tensor& k, const Tensor& v, int64_t past,
                      std::optional<double> scale) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&o, &q, &k, &v})
    TITAN_CHECK(t->dim() == 4 && t->dtype() == DType::f32 && t->is_contiguous(),
                "attention_decode: tensors must be contiguous f32 [B, S, H, D], got " + t->str());
  const int64_t b = q.size(0), t = q.size(1), h = q.size(2), dqk = q.size(3);
  const int64_t cap = k.size(1), hkv = k.size(2), dv = v.size(3);
  TITAN_CHECK(k.size(0) == b && v.size(0) == b && v.size(1) == cap && v.size(2) == hkv && k.size(3) == dqk,
              "attention_decode: cache shapes " + k.shape().str() + " / " + v.shape().str() + " do not fit q " + q.shape().str());
  TITAN_CHECK(h % hkv == 0 && past >= 0 && past + t <= cap, "attention_decode: " + std::to_string(past + t) +
                                                               " positions do not fit a cache of " + std::to_string(cap));
  TITAN_CHECK(o.shape() == Shape({b, t, h, dv}), "attention_decode: o must be " + Shape({b, t, h, dv}).str());
  const float sc = float(scale.value_or(default_attention_scale(dqk)));
  const float* qp = q.data<float>();
  const float* kp = k.data<float>();
  const float* vp = v.data<float>();
  float* op = o.data<float>();
  parallel_for(0, b * t * h, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> p(size_t(past + t));
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t bi = row / (t * h), ti = row / h % t, hi_ = row % h, kh = hi_ / (h / hkv);
      const float* qr = qp + ((bi * t + ti) * h + hi_) * dqk;
      const int64_t keys = past + ti + 1;
      float mx = -INFINITY;
      for (int64_t s = 0; s < keys; ++s) {
        const float* kr = kp + ((bi * cap + s) * hkv + kh) * dqk;
        float dot = 0;
        for (int64_t d = 0; d < dqk; ++d) dot += qr[d] * kr[d];
        p[size_t(s)] = dot * sc;
        mx = std::max(mx, p[size_t(s)]);
      }
      float sum = 0;
      for (int64_t s = 0; s < keys; ++s) sum += (p[size_t(s)] = std::exp(p[size_t(s)] - mx));
      float* orow = op + ((bi * t + ti) * h + hi_) * dv;
      for (int64_t d = 0; d < dv; ++d) orow[d] = 0;
      for (int64_t s = 0; s < keys; ++s) {
        const float w = p[size_t(s)] / sum;
        const float* vr = vp + ((bi * cap + s) * hkv + kh) * dv;
        for (int64_t d = 0; d < dv; ++d) orow[d] += w * vr[d];
      }
    }
  });
}

}  // namespace titan::kernels
