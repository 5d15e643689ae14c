#include "titan/kernels/attention.h"

#include <cmath>
#include <cstring>
#include <string>

#include "titan/kernels/columns.h"
#include "titan/kernels/cpu/attention.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/ref/attention.h"

namespace titan::kernels {

namespace {

void check_tensor(const Tensor& t, const char* name, DType dtype, const Shape& shape) {
  TITAN_CHECK(t.defined(), std::string("attention: ") + name + " is undefined",
              "allocate it, e.g. Tensor::empty(" + shape.str() + ", ...)");
  TITAN_CHECK(t.shape() == shape, std::string("attention: ") + name + " has shape " + t.shape().str() + ", expected " +
                                      shape.str(),
              "q is [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv], o [B, S, H, Dv], lse [B, H, S]");
  TITAN_CHECK(t.dtype() == dtype, std::string("attention: ") + name + " is " + std::string(dtype_name(t.dtype())) +
                                      ", expected " + std::string(dtype_name(dtype)),
              "q, k, v, o and the gradients share one dtype (f32 or bf16); lse is f32");
  TITAN_CHECK(t.is_contiguous(), std::string("attention: ") + name + " must be contiguous", "call .contiguous() first");
}

// Sizes from q, k, v, with the checks every entry point shares.
AttentionParams attention_dims(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale) {
  TITAN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be 4-d, got " + q.shape().str() + ", " + k.shape().str() + ", " + v.shape().str(),
              "layouts are q [B, S, H, Dqk], k [B, S, Hkv, Dqk], v [B, S, Hkv, Dv]");
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "attention: dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast activations to f32 or bf16");
  AttentionParams d;
  d.B = q.size(0), d.S = q.size(1), d.H = q.size(2), d.Dqk = q.size(3);
  d.Hkv = k.size(2), d.Dv = v.size(3);
  TITAN_CHECK(d.B > 0 && d.S > 0 && d.H > 0 && d.Hkv > 0 && d.Dqk > 0 && d.Dv > 0,
              "attention: empty dimension in q " + q.shape().str() + ", k " + k.shape().str() + " or v " +
                  v.shape().str(),
              "every size must be at least 1");
  TITAN_CHECK(d.H % d.Hkv == 0,
              "attention: " + std::to_string(d.H) + " query heads do not split into " + std::to_string(d.Hkv) +
                  " kv heads",
              "GQA needs H to be a multiple of Hkv");
  check_tensor(q, "q", q.dtype(), {d.B, d.S, d.H, d.Dqk});
  check_tensor(k, "k", q.dtype(), {d.B, d.S, d.Hkv, d.Dqk});
  check_tensor(v, "v", q.dtype(), {d.B, d.S, d.Hkv, d.Dv});
  d.scale = scale ? *scale : default_attention_scale(d.Dqk);
  TITAN_CHECK(std::isfinite(d.scale), "attention: scale " + std::to_string(d.scale) + " is not finite",
              "pass a finite softmax scale (Dqk^-0.5 by default)");
  return d;
}

// What every backward (plain or MLA) reads besides its inputs, and its dq.
void check_backward_common(const Tensor& o, const Tensor& dout, const Tensor& lse, const Tensor& dq, const Tensor& q,
                           const AttentionParams& d) {
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(dout, "dout", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.H, d.S});
  check_tensor(dq, "dq", q.dtype(), q.shape());
}

}  // namespace

double default_attention_scale(int64_t head_dim) { return 1.0 / std::sqrt(double(head_dim)); }

void attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       std::optional<double> scale) {
  const AttentionParams d = attention_dims(q, k, v, scale);
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.H, d.S});
  const bool fast = kernel_backend() == KernelBackend::fast;
  if (q.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(attention_forward<float>) : &ref::attention_forward<float>)(
        o.data<float>(), lse.data<float>(), q.data<float>(), k.data<float>(), v.data<float>(), d);
  } else {
    (fast ? TITAN_CPU_KERNEL(attention_forward<bf16>) : &ref::attention_forward<bf16>)(
        o.data<bf16>(), lse.data<float>(), q.data<bf16>(), k.data<bf16>(), v.data<bf16>(), d);
  }
}

void attention_backward(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& lse, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& o, std::optional<double> scale) {
  const AttentionParams d = attention_dims(q, k, v, scale);
  check_backward_common(o, dout, lse, dq, q, d);
  check_tensor(dk, "dk", q.dtype(), k.shape());
  check_tensor(dv, "dv", q.dtype(), v.shape());
  const bool fast = kernel_backend() == KernelBackend::fast;
  if (q.dtype() == DType::f32) {
    (fast ? TITAN_CPU_KERNEL(attention_backward<float>) : &ref::attention_backward<float>)(
        dq.data<float>(), dk.data<float>(), dv.data<float>(), lse.data<float>(), dout.data<float>(), q.data<float>(),
        k.data<float>(), v.data<float>(), o.data<float>(), d);
  } else {
    (fast ? TITAN_CPU_KERNEL(attention_backward<bf16>) : &ref::attention_backward<bf16>)(
        dq.data<bf16>(), dk.data<bf16>(), dv.data<bf16>(), lse.data<float>(), dout.data<bf16>(), q.data<bf16>(),
        k.data<bf16>(), v.data<bf16>(), o.data<bf16>(), d);
  }
}

namespace {
// Sizes of an MLA call (Hkv = H, Dqk = Dn + Dr), with its shape checks.
AttentionParams mla_dims(const Tensor& q, const Tensor& kv, const Tensor& k_rope, int64_t nope_dim,
                       std::optional<double> scale) {
  TITAN_CHECK(q.dim() == 4 && kv.dim() == 4 && k_rope.dim() == 4,
              "mla_attention: q, kv, k_rope must be 4-d, got " + q.shape().str() + ", " + kv.shape().str() + ", " +
                  k_rope.shape().str(),
              "layouts are q [B, S, H, Dn + Dr], kv [B, S, H, Dn + Dv], k_rope [B, S, 1, Dr]");
  AttentionParams d;
  d.B = q.size(0), d.S = q.size(1), d.H = q.size(2), d.Hkv = d.H, d.Dqk = q.size(3), d.Dv = kv.size(3) - nope_dim;
  const int64_t dr = k_rope.size(3);
  TITAN_CHECK(nope_dim > 0 && d.Dv > 0 && dr > 0 && d.Dqk == nope_dim + dr,
              "mla_attention: q " + q.shape().str() + ", kv " + kv.shape().str() + " and k_rope " +
                  k_rope.shape().str() + " do not split at nope_dim " + std::to_string(nope_dim),
              "q's last dim must be nope_dim + k_rope's, kv's last dim nope_dim + Dv with Dv > 0");
  TITAN_CHECK(q.dtype() == DType::f32 || q.dtype() == DType::bf16,
              "mla_attention: dtype " + std::string(dtype_name(q.dtype())) + " is not supported",
              "cast activations to f32 or bf16");
  check_tensor(q, "q", q.dtype(), {d.B, d.S, d.H, d.Dqk});
  check_tensor(kv, "kv", q.dtype(), {d.B, d.S, d.H, nope_dim + d.Dv});
  check_tensor(k_rope, "k_rope", q.dtype(), {d.B, d.S, 1, dr});
  d.scale = scale ? *scale : default_attention_scale(d.Dqk);
  TITAN_CHECK(std::isfinite(d.scale), "mla_attention: scale " + std::to_string(d.scale) + " is not finite",
              "pass a finite softmax scale");
  return d;
}

// The in-place kernels are f32 only: bf16 keeps attention's AMX path on assembled keys.
bool mla_in_place(const Tensor& q) { return q.dtype() == DType::f32 && kernel_backend() == KernelBackend::fast; }

// Per-head keys [B, S, H, Dn + Dr] and values [B, S, H, Dv] assembled from kv and k_rope.
std::pair<Tensor, Tensor> mla_assemble(const Tensor& kv, const Tensor& k_rope, int64_t nope_dim,
                                       const AttentionParams& d) {
  Tensor k = Tensor::empty({d.B, d.S, d.H, d.Dqk}, kv.dtype()), v = Tensor::empty({d.B, d.S, d.H, d.Dv}, kv.dtype());
  copy_columns(k, 0, kv, 0, nope_dim);
  copy_columns(k, nope_dim, k_rope, 0, d.Dqk - nope_dim, d.H);
  copy_columns(v, 0, kv, nope_dim, d.Dv);
  return {k, v};
}
}  // namespace

void mla_attention_forward(Tensor& o, Tensor& lse, const Tensor& q, const Tensor& kv, const Tensor& k_rope,
                           int64_t nope_dim, std::optional<double> scale) {
  const AttentionParams d = mla_dims(q, kv, k_rope, nope_dim, scale);
  check_tensor(o, "o", q.dtype(), {d.B, d.S, d.H, d.Dv});
  check_tensor(lse, "lse", DType::f32, {d.B, d.H, d.S});
  if (mla_in_place(q)) {
    TITAN_CPU_KERNEL(mla_attention_forward<float>)(o.data<float>(), lse.data<float>(), q.data<float>(),
                                                   kv.data<float>(), k_rope.data<float>(), nope_dim, d);
    return;
  }
  const auto [k, v] = mla_assemble(kv, k_rope, nope_dim, d);
  attention_forward(o, lse, q, k, v, d.scale);
}

void mla_attention_backward(Tensor& dq, Tensor& dkv, Tensor& dk_rope, const Tensor& lse, const Tensor& dout,
                            const Tensor& q, const Tensor& kv, const Tensor& k_rope, const Tensor& o, int64_t nope_dim,
                            std::optional<double> scale, bool accumulate) {
  const AttentionParams d = mla_dims(q, kv, k_rope, nope_dim, scale);
  check_backward_common(o, dout, lse, dq, q, d);
  check_tensor(dkv, "dkv", q.dtype(), kv.shape());
  check_tensor(dk_rope, "dk_rope", q.dtype(), k_rope.shape());
  if (mla_in_place(q)) {
    TITAN_CPU_KERNEL(mla_attention_backward<float>)(dq.data<float>(), dkv.data<float>(), dk_rope.data<float>(),
                                                    lse.data<float>(), dout.data<float>(), q.data<float>(),
                                                    kv.data<float>(), k_rope.data<float>(), o.data<float>(), nope_dim,
                                                    d, accumulate);
    return;
  }
  if (!accumulate) {
    // Storing equals adding to zeros (contiguous, checked above).
    for (Tensor* t : {&dq, &dkv, &dk_rope}) std::memset(t->data_ptr(), 0, t->nbytes());
  }
  const auto [k, v] = mla_assemble(kv, k_rope, nope_dim, d);
  Tensor dk = Tensor::zeros(k.shape(), k.dtype()), dv = Tensor::zeros(v.shape(), v.dtype());
  attention_backward(dq, dk, dv, lse, dout, q, k, v, o, d.scale);
  add_columns(dkv, 0, dk, 0, nope_dim);
  add_columns(dkv, nope_dim, dv, 0, d.Dv);
  add_columns(dk_rope, 0, dk, nope_dim, d.Dqk - nope_dim, d.H);  // the broadcast's backward sums over heads
}

}  // namespace titan::kernels
