#include "titan/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "titan/core/error.h"
#include "titan/kernels/matmul.h"

namespace titan::optim {

namespace {

// torch's lerp: start + w (end - start) for w < 1/2, else end - (end - start)(1 - w), in f32.
inline float lerp(float start, float end, float w) {
  const float diff = end - start;
  return w < 0.5f ? start + w * diff : end - diff * (1.0f - w);
}

// The matrices of a parameter: [rows, cols], or E of them stacked.
struct Matrices {
  int64_t count, rows, cols;
};
Matrices matrices_of(const Shape& s, const std::string& name) {
  TITAN_CHECK(s.size() == 2 || s.size() == 3,
              "Muon: parameter " + name + " is " + s.str() + ", not a matrix [rows, cols] or experts [E, rows, cols]",
              "give Muon the hidden matrices; embeddings, the output head, norms and biases go to AdamW");
  if (s.size() == 2) return {1, s[0], s[1]};
  return {s[0], s[1], s[2]};
}

}  // namespace

double muon_adjusted_lr(double lr, int64_t rows, int64_t cols, MuonLrAdjust adjust) {
  switch (adjust) {
    case MuonLrAdjust::original: return lr * std::sqrt(std::max(1.0, double(rows) / double(cols)));
    case MuonLrAdjust::match_rms_adamw: return lr * 0.2 * std::sqrt(double(std::max(rows, cols)));
  }
  return lr;
}

void newton_schulz(Tensor& x, const MuonConfig& c) {
  TITAN_CHECK(x.dim() == 2 && x.dtype() == DType::f32 && x.is_contiguous(),
              "newton_schulz: x must be a contiguous f32 matrix, got " + x.str());
  const int64_t rows = x.size(0), cols = x.size(1);
  const bool transposed = rows > cols;
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  Tensor cur = transposed ? x.transpose(0, 1).contiguous() : x.clone();  // [m, n]
  double sq = 0;
  for (int64_t i = 0; i < cur.numel(); ++i) sq += double(cur.data<float>()[i]) * double(cur.data<float>()[i]);
  const float inv = float(1.0 / std::max(std::sqrt(sq), c.eps));
  for (int64_t i = 0; i < cur.numel(); ++i) cur.data<float>()[i] *= inv;
  Tensor gram = Tensor::empty({m, m}, DType::f32), update = Tensor::empty({m, m}, DType::f32);
  Tensor next = Tensor::empty({m, n}, DType::f32);
  const auto [a, b, cc] = c.ns_coefficients;
  for (int step = 0; step < c.ns_steps; ++step) {
    kernels::matmul(gram, cur, cur, false, true);                              // A = X X^T
    update.copy_(gram);
    kernels::matmul(update, gram, gram, false, false, float(cc), float(b));    // b A + c A A
    next.copy_(cur);
    kernels::matmul(next, update, cur, false, false, 1.0f, float(a));          // a X + (b A + c A A) X
    std::swap(cur, next);
  }
  if (transposed) cur = cur.transpose(0, 1).contiguous();
  x.copy_(cur);
}

Muon::Muon(std::vector<nn::TrainableParam> params, const MuonConfig& config) : config_(config) {
  TITAN_CHECK(config.ns_steps >= 1 && config.ns_steps < 100 && config.momentum >= 0 && config.momentum < 1,
              "Muon: ns_steps must be in [1, 100) and momentum in [0, 1)");
  for (nn::TrainableParam& p : params) {
    const Tensor& v = p.var.value();
    matrices_of(v.shape(), p.name);
    TITAN_CHECK(v.dtype() == DType::f32 && v.is_contiguous(), "Muon: parameter " + p.name + " must be contiguous f32");
    Slot s;
    s.buffer = Tensor::zeros(v.shape(), DType::f32, MemCategory::optimizer_state);
    s.param = std::move(p);
    slots_.push_back(std::move(s));
  }
}

void Muon::step(float lr, float grad_scale) {
  for (Slot& s : slots_)
    if (s.param.var.grad().defined()) update(s, lr, grad_scale);
}

void Muon::update(Slot& s, float lr, float grad_scale) {
  Tensor& value = s.param.var.mutable_value();
  const Tensor& grad = s.param.var.grad();
  TITAN_CHECK(grad.is_contiguous() && grad.shape() == value.shape(), "Muon: the gradient of " + s.param.name +
                                                                          " must be contiguous " + value.shape().str());
  const Matrices mats = matrices_of(value.shape(), s.param.name);
  const int64_t size = mats.rows * mats.cols;
  const float mom = float(config_.momentum);
  Tensor u = Tensor::empty({mats.rows, mats.cols}, DType::f32);
  const float decay = float(1.0 - double(lr) * (s.param.weight_decay ? config_.weight_decay : 0.0));
  const float step_lr = float(muon_adjusted_lr(lr, mats.rows, mats.cols, config_.adjust));
  for (int64_t e = 0; e < mats.count; ++e) {
    float* p = value.data<float>() + e * size;
    float* buf = s.buffer.data<float>() + e * size;
    const float* g = grad.data<float>() + e * size;
    float* uu = u.data<float>();
    for (int64_t i = 0; i < size; ++i) {
      const float gi = g[i] * grad_scale;
      buf[i] = lerp(buf[i], gi, 1.0f - mom);
      uu[i] = config_.nesterov ? lerp(gi, buf[i], mom) : buf[i];
    }
    newton_schulz(u, config_);
    for (int64_t i = 0; i < size; ++i) p[i] = p[i] * decay + (-step_lr) * uu[i];
  }
  if (s.param.compute && s.param.compute->defined()) s.param.compute->copy_(value);  // copy_ rounds to bf16
}

std::vector<std::pair<std::string, Tensor>> Muon::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const Slot& s : slots_) out.emplace_back(s.param.name + ".momentum_buffer", s.buffer);
  return out;
}

void Muon::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  for (Slot& s : slots_) {
    const std::string key = s.param.name + ".momentum_buffer";
    const auto it = state.find(key);
    TITAN_CHECK(it != state.end() && it->second.shape() == s.buffer.shape(),
                source + ": Muon state '" + key + "' is " +
                    (it == state.end() ? std::string("missing") : it->second.shape().str()) + ", expected " +
                    s.buffer.shape().str(),
                "load a checkpoint trained with Muon on the same model");
    s.buffer.copy_(it->second.to(DType::f32));
  }
}

}  // namespace titan::optim
