// DSA: the small-op implementation (see dsa.h).
#include "titan/models/deepseek_v3/dsa.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "titan/autograd/ops.h"
#include "titan/core/error.h"
#include "titan/kernels/topk.h"

namespace titan::models::deepseek_v3 {

using namespace autograd;

const char* dsa_stage_name(DsaStage s) { return s == DsaStage::dense_warmup ? "dense_warmup" : "sparse"; }

Variable hadamard_small_ops(const Variable& x) {
  // H / sqrt(n) with H the Sylvester Hadamard matrix: H[i][j] = (-1)^popcount(i & j). Symmetric,
  // so x H is the row-wise transform.
  const int64_t n = x.shape()[x.shape().size() - 1];
  Tensor h = Tensor::empty({n, n}, DType::f32);
  float* hp = h.data<float>();
  const float norm = float(1.0 / std::sqrt(double(n)));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) hp[i * n + j] = (__builtin_popcountll(uint64_t(i & j)) & 1) ? -norm : norm;
  const Variable rows = view(cast(x, DType::f32), {x.value().numel() / n, n});
  return cast(view(matmul(rows, Variable(h)), x.shape()), x.dtype());
}

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// keep [B, S, S] u8: key s is a causal candidate of query t.
Tensor causal_keep(int64_t b, int64_t s) {
  Tensor keep = Tensor::empty({b, s, s}, DType::u8, MemCategory::activations);
  uint8_t* k = keep.data<uint8_t>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t t = 0; t < s; ++t)
      for (int64_t j = 0; j < s; ++j) k[(bi * s + t) * s + j] = j <= t;
  return keep;
}

// keep [B, S, S] u8 of the top-k causal keys of each query by index score (I [B, S, S]); rows with
// fewer than k causal keys keep them all. kernels::topk ranks equal scores lower index first,
// as kernels::indexer_topk does, so both paths select the same set.
Tensor topk_keep(const Tensor& scores, const Tensor& causal, int64_t k) {
  const int64_t b = scores.size(0), s = scores.size(1);
  Tensor masked = scores.clone(MemCategory::activations);  // [B, S, S]
  float* m = masked.data<float>();
  const uint8_t* c = causal.data<uint8_t>();
  for (int64_t e = 0; e < masked.numel(); ++e)
    if (!c[e]) m[e] = kNegInf;
  const int64_t kk = std::min(k, s);
  Tensor values = Tensor::empty({b, s, kk}, DType::f32, MemCategory::activations);
  Tensor idx = Tensor::empty({b, s, kk}, DType::i32, MemCategory::activations);
  kernels::topk(values, idx, masked, kk);
  Tensor keep = Tensor::zeros({b, s, s}, DType::u8, MemCategory::activations);
  uint8_t* kp = keep.data<uint8_t>();
  const float* v = values.data<float>();
  const int32_t* ip = idx.data<int32_t>();
  for (int64_t r = 0; r < b * s; ++r)
    for (int64_t i = 0; i < kk; ++i)
      if (v[r * kk + i] != kNegInf) kp[r * s + ip[r * kk + i]] = 1;  // -inf: a future key filling the row
  return keep;
}

// p [B, S, S] = the head mean of the probabilities P [B, H, S, S] (detached).
Tensor head_mean(const Tensor& probs) {
  const int64_t b = probs.size(0), h = probs.size(1), ss = probs.size(2) * probs.size(3);
  Tensor p = Tensor::zeros({b, probs.size(2), probs.size(3)}, DType::f32, MemCategory::activations);
  const float* src = probs.data<float>();
  float* dst = p.data<float>();
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t hi = 0; hi < h; ++hi)
      for (int64_t e = 0; e < ss; ++e) dst[bi * ss + e] += src[(bi * h + hi) * ss + e];
  for (int64_t e = 0; e < p.numel(); ++e) dst[e] /= float(h);
  return p;
}
}  // namespace

DsaOutputs dsa_attention_small_ops(const DsaInputs& in_compute) {
  TITAN_CHECK(!in_compute.kv_keys.defined() && !in_compute.tp,
              "DSA small ops: context and tensor parallelism run the fused kernels",
              "set model.converters = [\"dsa_fused\"]");
  // The generic ops are f32: under bf16 compute the inputs are cast up and the output back.
  const DType compute = in_compute.q.dtype();
  DsaInputs in = in_compute;
  for (Variable* v : {&in.q, &in.c, &in.k_rope, &in.index_q, &in.index_k}) *v = cast(*v, DType::f32);
  const int64_t b = in.q.shape()[0], s = in.q.shape()[1], h = in.n_heads;
  const int64_t hi = in.index_q.shape()[2], di = in.index_q.shape()[3];
  const Tensor causal = causal_keep(b, s);

  // Index scores I [B, S, S] = sum_j w[t, j] ReLU(q[t, j] . k[s]).
  Variable dots = matmul(view(in.index_q, {b, s * hi, di}), in.index_k, false, true);  // [B, S * HI, S]
  Variable relu_dots = view(relu(dots), {b * s, hi, s});
  Variable scores = view(matmul(view(in.index_w, {b * s, 1, hi}), relu_dots), {b, s, s});

  const Tensor keep = in.stage == DsaStage::sparse ? topk_keep(scores.value(), causal, in.topk) : causal;

  // Standard-form MLA with the additive -inf mask: every selected key, per head.
  Variable kv_up = view(linear(in.c, in.wkv_b), {b, s, h, in.nope_dim + in.v_dim});
  Variable k = concat_last(narrow_last(kv_up, 0, in.nope_dim), in.k_rope);  // [B, S, H, d_qk]
  Variable v = narrow_last(kv_up, in.nope_dim, in.v_dim);                     // [B, S, H, d_v]
  Variable logits = scale(matmul(transpose(in.q, 1, 2), transpose(k, 1, 2), false, true), in.scale);  // [B, H, S, S]
  Variable probs = softmax(masked_fill(logits, keep.view({b, 1, s, s}), kNegInf));
  Variable o = transpose(matmul(probs, transpose(v, 1, 2)), 1, 2);  // [B, S, H, d_v]

  DsaOutputs out{cast(o, compute), {}};
  if (!in.want_loss) return out;
  // KL(p || softmax(I)) per row over the kept keys: sum p log p (a constant) - sum p log q. The
  // masked log q entries (-inf) are zeroed so that 0 * -inf never appears.
  const Tensor p = head_mean(probs.value());  // [B, S, S], 0 off the kept set
  double entropy_term = 0;
  const float* pp = p.data<float>();
  for (int64_t e = 0; e < p.numel(); ++e)
    if (pp[e] > 0) entropy_term += double(pp[e]) * std::log(double(pp[e]));
  Variable log_q = masked_fill(log_softmax(masked_fill(scores, keep, kNegInf)), keep, 0.0);
  Variable cross = sum(mul(Variable(p), log_q));
  const double rows = double(b * s);
  out.loss = add(scale(cross, -1.0 / rows), Variable(Tensor::full({1}, entropy_term / rows, DType::f32)));
  return out;
}

}  // namespace titan::models::deepseek_v3
