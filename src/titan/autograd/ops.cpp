#include "titan/autograd/ops.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <omp.h>

#include "titan/autograd/half_linear.h"
#include "titan/core/profiler.h"

#include "titan/kernels/activation.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/embedding.h"
#include "titan/kernels/grouped_matmul.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/moe_permute.h"
#include "titan/kernels/norm.h"
#include "titan/kernels/compressor.h"
#include "titan/kernels/sinkhorn.h"
#include "titan/kernels/softmax.h"
#include "titan/kernels/v4_attention.h"

namespace titan::autograd {

namespace {
Tensor activation_like(const Shape& shape, DType dtype) { return Tensor::empty(shape, dtype, MemCategory::activations); }

// The gradient of a `dtype` value flowing into an f32 master parameter: the kernels take f32 dw.
Tensor none() { return Tensor(); }
}  // namespace

Variable linear(const Variable& x, const Variable& w, const Tensor& w_compute) {
  ProfileScope prof("linear.fwd");
  const Tensor& wc = w_compute.defined() ? w_compute : w.value();
  TITAN_CHECK(x.value().size(-1) == wc.size(1), "linear: input width " + std::to_string(x.value().size(-1)) +
                                                    " does not match weight " + wc.shape().str() +
                                                    (w.name().empty() ? "" : " (" + w.name() + ")"));
  if (wc.dtype() == DType::f16 && x.dtype() == DType::f32) return half_linear(x, w, wc);  // fp16 mixed precision
  Shape ys = x.shape();
  ys[ys.size() - 1] = wc.size(0);
  // The GEMM's inputs share one dtype: an f32 master weight with bf16 activations needs a compute copy.
  TITAN_CHECK(wc.dtype() == x.dtype(), "linear: activations are " + std::string(dtype_name(x.dtype())) +
                                           " but the weight is " + std::string(dtype_name(wc.dtype())),
              "pass the weight's compute copy for mixed precision");
  const Tensor y = keep_or_compute([&] {
    Tensor out = activation_like(ys, x.dtype());
    kernels::linear_forward(out, x.value(), wc);
    return std::vector<Tensor>{out};
  })[0];
  return record("linear", {x, w}, y, [xv = x.value(), wc](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("linear.bwd");
    // dx and dw written outright when they are still zero (grad_to_write), else added.
    bool accumulate_dx = true, accumulate_dw = true;
    Tensor none;
    // Only a parameter's (a leaf's) gradient can wait: an activation's producer needs it now.
    if (WeightGradQueue* later = deferred_weight_grads(); later && g.needs(1) && g.slot(1)->is_leaf) {
      Tensor dx = g.grad_to_write(0, &accumulate_dx);
      if (dx.defined()) kernels::linear_backward(dx, none, none, dy, xv, wc, accumulate_dx, true);
      later->push([slot = g.slot(1), dy, xv, wc] {
        ProfileScope prof_w("linear.bwd_weight");
        const std::shared_ptr<GradSlot> slots[] = {slot};
        GradSink sink(slots);
        bool accumulate = true;
        Tensor dw = sink.grad_to_write(0, &accumulate), nothing;
        kernels::linear_backward(nothing, dw, nothing, dy, xv, wc, true, accumulate);
      });
      return;
    }
    Tensor dx = g.grad_to_write(0, &accumulate_dx), dw = g.grad_to_write(1, &accumulate_dw);
    kernels::linear_backward(dx, dw, none, dy, xv, wc, accumulate_dx, accumulate_dw);
  });
}

Variable embedding(const Tensor& ids, const Variable& table, DType dtype) {
  ProfileScope prof("embedding.fwd");
  Shape ys = ids.shape();
  ys.push_back(table.value().size(1));
  Tensor y = activation_like(ys, dtype);
  kernels::embedding_forward(y, table.value(), ids);
  return record("embedding", {table}, y, [ids](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("embedding.bwd");
    Tensor dt = g.grad(0);
    kernels::embedding_backward(dt, dy, ids);
  });
}

Variable rmsnorm(const Variable& x, const Variable& w, double eps) {
  ProfileScope prof("rmsnorm.fwd");
  const int64_t rows = x.value().numel() / x.value().size(-1);
  Tensor y = activation_like(x.shape(), x.dtype());
  Tensor rstd = Tensor::empty({rows}, DType::f32, MemCategory::activations);
  kernels::rmsnorm_forward(y, rstd, x.value(), w.value(), eps);
  return record("rmsnorm", {x, w}, y, [xv = x.value(), wv = w.value(), rstd](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("rmsnorm.bwd");
    Tensor dx = g.grad(0), dw = g.grad(1);
    kernels::rmsnorm_backward(dx, dw, rstd, dy, xv, wv);
  });
}

Variable layernorm(const Variable& x, const Variable& w, const Variable& b, double eps) {
  ProfileScope prof("layernorm.fwd");
  const int64_t rows = x.value().numel() / x.value().size(-1);
  Tensor y = activation_like(x.shape(), x.dtype());
  Tensor mean = Tensor::empty({rows}, DType::f32, MemCategory::activations);
  Tensor rstd = Tensor::empty({rows}, DType::f32, MemCategory::activations);
  kernels::layernorm_forward(y, mean, rstd, x.value(), w.value(), b.value(), eps);
  return record("layernorm", {x, w, b}, y,
                [xv = x.value(), wv = w.value(), mean, rstd](const Tensor& dy, GradSink& g) {
                  ProfileScope prof_bwd("layernorm.bwd");
                  Tensor dx = g.grad(0), dw = g.grad(1), db = g.grad(2);
                  kernels::layernorm_backward(dx, dw, db, mean, rstd, dy, xv, wv);
                });
}

Variable rope(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions, kernels::RopeLayout layout,
              int64_t rope_offset) {
  ProfileScope prof("rope.fwd");
  Tensor y = activation_like(x.shape(), x.dtype());
  kernels::rope_forward(y, x.value(), tables, positions, layout, rope_offset);
  return record("rope", {x}, y, [tables, positions, layout, rope_offset](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("rope.bwd");
    bool accumulate = true;  // written outright while x's gradient is still zero
    Tensor dx = g.grad_to_write(0, &accumulate);
    if (dx.defined()) kernels::rope_backward(dx, dy, tables, positions, layout, rope_offset, accumulate);
  });
}

Variable rope_inverse(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions,
                      kernels::RopeLayout layout, int64_t rope_offset) {
  ProfileScope prof("rope_inverse.fwd");
  Tensor y = activation_like(x.shape(), x.dtype());
  kernels::rope_backward(y, x.value().contiguous(), tables, positions, layout, rope_offset, /*accumulate=*/false);
  return record("rope_inverse", {x}, y, [tables, positions, layout, rope_offset](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("rope_inverse.bwd");
    Tensor dx = g.grad(0);
    if (!dx.defined()) return;
    Tensor turned = Tensor::empty(dy.shape(), dy.dtype(), MemCategory::temporaries);
    kernels::rope_forward(turned, dy.contiguous(), tables, positions, layout, rope_offset);
    kernels::axpby(dx, turned, 1.0, 1.0);
  });
}

Variable attention(const Variable& q, const Variable& k, const Variable& v, std::optional<double> scale,
                   Tensor* lse_out) {
  ProfileScope prof("attention.fwd");
  const Tensor& qv = q.value();
  Shape os = qv.shape();
  os[3] = v.value().size(3);
  const std::vector<Tensor> out = keep_or_compute([&] {
    Tensor o = activation_like(os, qv.dtype());
    Tensor lse = Tensor::empty({qv.size(0), qv.size(2), qv.size(1)}, DType::f32, MemCategory::activations);
    kernels::attention_forward(o, lse, qv, k.value(), v.value(), scale);
    return std::vector<Tensor>{o, lse};
  });
  const Tensor &o = out[0], &lse = out[1];
  if (lse_out) *lse_out = lse;
  return record("attention", {q, k, v}, o,
                [qv, kv = k.value(), vv = v.value(), o, lse, scale](const Tensor& dout, GradSink& g) {
    ProfileScope prof_bwd("attention.bwd");
                  Tensor dq = g.grad(0), dk = g.grad(1), dv = g.grad(2);
                  kernels::attention_backward(dq, dk, dv, lse, dout, qv, kv, vv, o, scale);
                });
}

Variable swiglu(const Variable& gate, const Variable& up, double limit) {
  ProfileScope prof("swiglu.fwd");
  Tensor y = activation_like(gate.shape(), gate.dtype());
  kernels::swiglu_forward(y, gate.value(), up.value(), limit);
  return record("swiglu", {gate, up}, y, [gv = gate.value(), uv = up.value(), limit](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("swiglu.bwd");
    // Both written into fresh buffers when neither input has a gradient yet (both are projection
    // outputs in a feed-forward); otherwise added.
    const bool fresh = g.can_adopt(0) && g.can_adopt(1);
    auto fresh_like = [&] { return Tensor::empty(dy.shape(), dy.dtype(), MemCategory::temporaries); };
    Tensor dgate = fresh ? fresh_like() : g.grad(0), dup = fresh ? fresh_like() : g.grad(1);
    kernels::swiglu_backward(dgate, dup, dy, gv, uv, !fresh, limit);
    if (!fresh) return;
    g.adopt(0, dgate);
    if (!g.adopt(1, dup)) {  // gate and up are one variable: its gradient is now dgate
      Tensor d = g.grad(1);
      kernels::axpby(d, dup, 1.0, 1.0);
    }
  });
}

Variable add(const Variable& a, const Variable& b, double alpha) {
  ProfileScope prof("add.fwd");
  Tensor y = activation_like(a.shape(), a.dtype());
  kernels::add(y, a.value(), b.value(), alpha);
  return record("add", {a, b}, y, [alpha](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("add.bwd");
    // Only one input may take dy's buffer: two gradients sharing storage would alias when a
    // later backward reads one while accumulating into the other.
    Tensor da = g.adopt(0, dy) ? none() : g.grad(0);
    Tensor db = g.grad(1);
    kernels::add_backward(da, db, dy, alpha);
  });
}

Variable view(const Variable& x, const Shape& shape) {
  ProfileScope prof("view.fwd");
  return record("view", {x}, x.value().view(shape), [shape_in = x.shape()](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("view.bwd");
    const Tensor dyv = dy.view(shape_in);
    if (g.adopt(0, dyv)) return;
    Tensor dx = g.grad(0);
    kernels::axpby(dx, dyv, 1.0, 1.0);
  });
}

Variable narrow_last(const Variable& x, int64_t start, int64_t length) {
  ProfileScope prof("narrow_last.fwd");
  Shape ys = x.shape();
  TITAN_CHECK(!ys.empty(), "narrow_last: input is a scalar", "pass a tensor with a last dim to split");
  ys[ys.size() - 1] = length;
  Tensor y = activation_like(ys, x.dtype());
  kernels::copy_columns(y, 0, x.value(), start, length);
  return record("narrow_last", {x}, y, [start, length](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("narrow_last.bwd");
    Tensor dx = g.grad(0);
    kernels::add_columns(dx, start, dy, 0, length);
  });
}

Variable concat_last(const Variable& a, const Variable& b) {
  ProfileScope prof("concat_last.fwd");
  const Shape &as = a.shape(), &bs = b.shape();
  const int n = int(as.size());
  bool leading_match = n >= 2 && int(bs.size()) == n && (bs[n - 2] == as[n - 2] || bs[n - 2] == 1);
  for (int d = 0; leading_match && d < n - 2; ++d) leading_match = as[d] == bs[d];
  TITAN_CHECK(leading_match && a.dtype() == b.dtype(),
              "concat_last: cannot join " + a.value().str() + " and " + b.value().str(),
              "b must be [..., H, Db] or [..., 1, Db] with a's leading dims and dtype");
  const int64_t da = as[n - 1], db = bs[n - 1], repeat = as[n - 2] / bs[n - 2];
  Shape ys = as;
  ys[n - 1] = da + db;
  Tensor y = activation_like(ys, a.dtype());
  kernels::copy_columns(y, 0, a.value(), 0, da);
  kernels::copy_columns(y, da, b.value(), 0, db, repeat);
  return record("concat_last", {a, b}, y, [da, db, repeat](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("concat_last.bwd");
    if (g.needs(0)) {
      Tensor dga = g.grad(0);
      kernels::add_columns(dga, 0, dy, 0, da);
    }
    if (g.needs(1)) {
      Tensor dgb = g.grad(1);
      kernels::add_columns(dgb, 0, dy, da, db, repeat);  // the broadcast's backward sums over heads
    }
  });
}

std::pair<Variable, Variable> mla_keys_values(const Variable& kv, const Variable& k_rope, int64_t nope_dim) {
  ProfileScope prof("mla_keys_values.fwd");
  const Shape &ks = kv.shape(), &rs = k_rope.shape();
  const int n = int(ks.size());
  bool shapes_fit = n >= 2 && int(rs.size()) == n && rs[n - 2] == 1 && nope_dim > 0 && nope_dim < ks[n - 1];
  for (int d = 0; shapes_fit && d < n - 2; ++d) shapes_fit = ks[d] == rs[d];
  TITAN_CHECK(shapes_fit && kv.dtype() == k_rope.dtype(),
              "mla_keys_values: cannot split " + kv.value().str() + " at " + std::to_string(nope_dim) +
                  " and join the rope key " + k_rope.value().str(),
              "kv must be [..., H, Dn + Dv] with 0 < Dn < Dn + Dv and k_rope [..., 1, Dr] with kv's leading dims "
              "and dtype");
  const int64_t heads = ks[n - 2], dn = nope_dim, dv = ks[n - 1] - nope_dim, dr = rs[n - 1];
  Shape k_shape = ks, v_shape = ks;
  k_shape[n - 1] = dn + dr;
  v_shape[n - 1] = dv;
  Tensor k = activation_like(k_shape, kv.dtype()), v = activation_like(v_shape, kv.dtype());
  kernels::copy_columns(k, 0, kv.value(), 0, dn);
  kernels::copy_columns(k, dn, k_rope.value(), 0, dr, heads);
  kernels::copy_columns(v, 0, kv.value(), dn, dv);
  const Shape kv_shape = ks;
  auto outs = record("mla_keys_values", {kv, k_rope}, {k, v},
                     [kv_shape, heads, dn, dv, dr](std::span<const Tensor> d, GradSink& g) {
    ProfileScope prof_bwd("mla_keys_values.bwd");
    const Tensor &dk = d[0], &dvv = d[1];
    if (g.needs(0)) {
      // Every column of dkv comes from dk's nope part or dv, so it is written once, not
      // zero-filled (unless one of them got no gradient).
      const bool both = dk.defined() && dvv.defined();
      const DType dt = dk.defined() ? dk.dtype() : dvv.dtype();
      Tensor dkv = both ? Tensor::empty(kv_shape, dt) : Tensor::zeros(kv_shape, dt);
      if (dk.defined()) kernels::copy_columns(dkv, 0, dk, 0, dn);
      if (dvv.defined()) kernels::copy_columns(dkv, dn, dvv, 0, dv);
      if (!g.adopt(0, dkv)) {
        Tensor acc = g.grad(0);
        kernels::add_columns(acc, 0, dkv, 0, dn + dv);
      }
    }
    if (g.needs(1) && dk.defined()) {
      Tensor dr_grad = g.grad(1);
      kernels::add_columns(dr_grad, 0, dk, dn, dr, heads);  // the broadcast's backward sums over heads
    }
  });
  return {outs[0], outs[1]};
}

Variable mla_attention(const Variable& q, const Variable& kv, const Variable& k_rope, int64_t nope_dim,
                       std::optional<double> scale) {
  if (q.dtype() != DType::f32) {
    // bf16 keeps attention's AMX kernels, which take assembled keys and values; built once here,
    // the backward reuses them.
    const auto [k, v] = mla_keys_values(kv, k_rope, nope_dim);
    return attention(q, k, v, scale);
  }
  ProfileScope prof("attention.fwd");
  const Tensor& qv = q.value();
  const std::vector<Tensor> out = keep_or_compute([&] {
    Tensor o = activation_like({qv.size(0), qv.size(1), qv.size(2), kv.value().size(3) - nope_dim}, qv.dtype());
    Tensor lse = Tensor::empty({qv.size(0), qv.size(2), qv.size(1)}, DType::f32, MemCategory::activations);
    kernels::mla_attention_forward(o, lse, qv, kv.value(), k_rope.value(), nope_dim, scale);
    return std::vector<Tensor>{o, lse};
  });
  const Tensor &o = out[0], &lse = out[1];
  return record("mla_attention", {q, kv, k_rope}, o,
                [qv, kvv = kv.value(), rv = k_rope.value(), o, lse, nope_dim, scale](const Tensor& dout, GradSink& g) {
                  ProfileScope prof_bwd("attention.bwd");
                  // The kernel writes all three gradients. When every input that needs one has none
                  // yet (the usual case) it stores them into fresh buffers that are then adopted:
                  // no zero-fill, no read-back. Otherwise it adds to the existing ones (and to
                  // scratch zeros for an input that needs none).
                  const bool fresh = (!g.needs(0) || g.can_adopt(0)) && (!g.needs(1) || g.can_adopt(1)) &&
                                     (!g.needs(2) || g.can_adopt(2));
                  auto grad_for = [&g, fresh](size_t i, const Tensor& like) {
                    if (fresh) return Tensor::empty(like.shape(), like.dtype());
                    return g.needs(i) ? g.grad(i) : Tensor::zeros(like.shape(), like.dtype());
                  };
                  Tensor dq = grad_for(0, qv), dkv = grad_for(1, kvv), dr = grad_for(2, rv);
                  kernels::mla_attention_backward(dq, dkv, dr, lse, dout, qv, kvv, rv, o, nope_dim, scale, !fresh);
                  if (fresh) {
                    for (size_t i = 0; i < 3; ++i) {
                      if (g.needs(i)) g.adopt(i, i == 0 ? dq : i == 1 ? dkv : dr);
                    }
                  }
                });
}

Variable cross_entropy(const Variable& logits, const Tensor& targets) {
  ProfileScope prof("cross_entropy.fwd");
  const Tensor& lv = logits.value();
  const int64_t n = lv.size(0);
  Tensor loss = Tensor::empty({n}, DType::f32, MemCategory::activations);
  Tensor lse = Tensor::empty({n}, DType::f32, MemCategory::activations);
  const kernels::CrossEntropyResult r = kernels::cross_entropy_forward(loss, lse, lv, targets);
  return record("cross_entropy", {logits}, Tensor::full({1}, r.mean_loss, DType::f32),
                [lv, targets, lse](const Tensor& dmean, GradSink& g) {
    ProfileScope prof_bwd("cross_entropy.bwd");
                  const double d = dmean.item();
                  if (g.adopt(0, lv)) {
                    Tensor dl = lv;
                    kernels::cross_entropy_mean_backward(dl, lv, targets, lse, d);
                    return;
                  }
                  Tensor tmp = Tensor::empty(lv.shape(), lv.dtype());
                  kernels::cross_entropy_mean_backward(tmp, lv, targets, lse, d);
                  Tensor dl = g.grad(0);
                  kernels::axpby(dl, tmp, 1.0, 1.0);
                });
}

Variable moe_permute(const Variable& x, const Tensor& pos) {
  ProfileScope prof("moe_permute.fwd");
  Tensor xs = activation_like({pos.numel(), x.shape()[1]}, x.dtype());  // [N k, D]
  kernels::moe_permute_forward(xs, x.value(), pos);
  return record("moe_permute", {x}, xs, [pos](const Tensor& dxs, GradSink& g) {
    ProfileScope prof_bwd("moe_permute.bwd");
    Tensor dx = g.grad(0);
    kernels::moe_permute_backward(dx, dxs.contiguous(), pos);
  });
}

Variable moe_unpermute(const Variable& out, const Tensor& pos, const Variable& weights) {
  ProfileScope prof("moe_unpermute.fwd");
  Tensor y = activation_like({pos.size(0), out.shape()[1]}, out.dtype());  // [N, D]
  kernels::moe_unpermute_forward(y, out.value(), pos, weights.value());
  return record("moe_unpermute", {out, weights}, y,
                [ov = out.value(), pos, wv = weights.value()](const Tensor& dy, GradSink& g) {
                  ProfileScope prof_bwd("moe_unpermute.bwd");
                  // The kernel writes every row of dout (each has one source): into a fresh
                  // buffer the gradient adopts, or a temporary added to the existing one.
                  Tensor dout;
                  if (g.needs(0)) dout = Tensor::empty(ov.shape(), ov.dtype(), MemCategory::temporaries);
                  kernels::moe_unpermute_backward(dout, g.grad(1), dy.contiguous(), ov, pos, wv);
                  if (g.needs(0) && !g.adopt(0, dout)) {
                    Tensor acc = g.grad(0);
                    kernels::axpby(acc, dout, 1.0, 1.0);
                  }
                });
}

Variable grouped_matmul(const Variable& a, const Variable& w, std::span<const int64_t> offsets, const Tensor& w_compute) {
  ProfileScope prof("grouped_matmul.fwd");
  const Tensor& wc = w_compute.defined() ? w_compute : w.value();
  Tensor c = activation_like({a.shape()[0], wc.size(1)}, a.dtype());  // [M, N]
  kernels::grouped_matmul_forward(c, a.value(), wc, offsets);
  return record("grouped_matmul", {a, w}, c,
                [av = a.value(), wc, offs = std::vector<int64_t>(offsets.begin(), offsets.end())](const Tensor& dc,
                                                                                                   GradSink& g) {
                  ProfileScope prof_bwd("grouped_matmul.bwd");
                  bool accumulate_da = true, accumulate_dw = true;
                  const Tensor da = g.grad_to_write(0, &accumulate_da), dw = g.grad_to_write(1, &accumulate_dw);
                  kernels::grouped_matmul_backward(da, dw, dc.contiguous(), av, wc, offs, accumulate_dw, accumulate_da);
                });
}

// ---- generic small ops ----------------------------------------------------------------------
// Their element-wise loops are plain f32 loops written here: these ops make up reference paths
// (what fused kernels are checked against), so they favour obviousness over speed.

namespace {
void check_f32(const char* op, std::initializer_list<const Variable*> xs) {
  for (const Variable* x : xs)
    TITAN_CHECK(x->dtype() == DType::f32 && x->value().is_contiguous(),
                std::string(op) + ": the small ops take contiguous f32, got " + x->value().str(),
                "run the small-op path in f32 (the fused kernels take bf16)");
}

// dst += src, f32 of one shape.
void accumulate(Tensor& dst, const Tensor& src) { kernels::axpby(dst, src, 1.0, 1.0); }
}  // namespace

Variable matmul(const Variable& a, const Variable& b, bool trans_a, bool trans_b) {
  ProfileScope prof("matmul.fwd");
  check_f32("matmul", {&a, &b});
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  TITAN_CHECK(as.size() >= 2 && (bs.size() == 2 || bs.size() == as.size()),
              "matmul: cannot multiply " + a.value().str() + " by " + b.value().str(),
              "b is 2-D or has a's leading dims");
  const int n = int(as.size());
  const int64_t m = trans_a ? as[n - 1] : as[n - 2];
  const int64_t cols = trans_b ? bs[bs.size() - 2] : bs[bs.size() - 1];
  Shape cs = as;
  cs[n - 2] = m;
  cs[n - 1] = cols;
  const Tensor c = keep_or_compute([&] {
    Tensor out = activation_like(cs, DType::f32);
    kernels::matmul(out, a.value(), b.value(), trans_a, trans_b);
    return std::vector<Tensor>{out};
  })[0];
  return record("matmul", {a, b}, c,
                [av = a.value(), bv = b.value(), trans_a, trans_b](const Tensor& dc, GradSink& g) {
                  ProfileScope prof_bwd("matmul.bwd");
                  Tensor da = g.grad(0), db = g.grad(1);
                  kernels::matmul_backward(da, db, dc.contiguous(), av, bv, trans_a, trans_b);
                });
}

Variable relu(const Variable& x) {
  ProfileScope prof("relu.fwd");
  check_f32("relu", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] > 0 ? xp[i] : 0.0f;
  return record("relu", {x}, y, [xv = x.value()](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("relu.bwd");
    Tensor dx = g.grad(0);
    const float* in = xv.data<float>();
    const float* d = dy.data<float>();
    float* dxp = dx.data<float>();
    const int64_t count = dx.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i)
      if (in[i] > 0) dxp[i] += d[i];
  });
}

Variable scale(const Variable& x, double alpha) {
  ProfileScope prof("scale.fwd");
  check_f32("scale", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  kernels::scale(y, x.value(), alpha);
  return record("scale", {x}, y, [alpha](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("scale.bwd");
    Tensor dx = g.grad(0);
    kernels::axpby(dx, dy, alpha, 1.0);
  });
}

namespace {
// Where each row of a (its last dim) finds b under mul's broadcast: b's offset of a's row r and
// b's stride along the last dim (0: broadcast).
struct Broadcast {
  std::vector<int64_t> a_dims, b_strides;  // a's leading dims and b's strides over them (0: broadcast)
  int64_t last_stride = 1;
  int64_t b_row(int64_t r) const {
    int64_t off = 0;
    for (int d = int(a_dims.size()) - 1; d >= 0; --d) {
      off += (r % a_dims[size_t(d)]) * b_strides[size_t(d)];
      r /= a_dims[size_t(d)];
    }
    return off;
  }
};

Broadcast broadcast_of(const Shape& as, const Shape& bs) {
  const int n = int(as.size()), nb = int(bs.size());
  bool fits = nb <= n && n >= 1;
  for (int i = 1; fits && i <= nb; ++i) fits = bs[nb - i] == 1 || bs[nb - i] == as[n - i];
  TITAN_CHECK(fits, bs.str() + " does not broadcast to " + as.str(),
              "b's dims, aligned right, must be 1 or equal to a's");
  Broadcast br;
  std::vector<int64_t> full(static_cast<size_t>(n), 1);  // b's shape padded on the left to a's rank
  for (int i = 0; i < nb; ++i) full[size_t(n - nb + i)] = bs[i];
  int64_t stride = 1;
  std::vector<int64_t> strides(static_cast<size_t>(n));
  for (int d = n - 1; d >= 0; --d) {
    strides[size_t(d)] = full[size_t(d)] == 1 ? 0 : stride;
    stride *= full[size_t(d)];
  }
  br.a_dims.assign(as.begin(), as.begin() + (n - 1));
  br.b_strides.assign(strides.begin(), strides.end() - 1);
  br.last_stride = strides[size_t(n - 1)];
  return br;
}

// f(k, b value) for every element k = r d + i of a, with b's value broadcast to it.
template <class F>
void for_each_broadcast(const float* b, const Broadcast& br, int64_t rows, int64_t d, F f) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* b_row = b + br.b_row(r);
    for (int64_t i = 0; i < d; ++i) f(r * d + i, b_row[i * br.last_stride]);
  }
}

// db [b's shape] += the sum of dy (times a, when given) over the dims b was broadcast along:
// per-thread partial sums in double, then added in thread order (the same on every run with the
// same thread count).
void sum_into_broadcast(Tensor& db, const float* dp, const float* a, const Broadcast& br, int64_t rows, int64_t d) {
  const int64_t nb = db.numel();
  const int threads = omp_get_max_threads();
  std::vector<double> partial(size_t(threads) * size_t(nb), 0.0);
#pragma omp parallel num_threads(threads)
  {
    double* mine = partial.data() + size_t(omp_get_thread_num()) * size_t(nb);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      double* acc = mine + br.b_row(r);
      for (int64_t i = 0; i < d; ++i)
        acc[i * br.last_stride] += double(dp[r * d + i]) * (a ? double(a[r * d + i]) : 1.0);
    }
  }
  float* dbp = db.data<float>();
  for (int64_t j = 0; j < nb; ++j) {
    double total = 0;
    for (int t = 0; t < threads; ++t) total += partial[size_t(t) * size_t(nb) + size_t(j)];
    dbp[j] += float(total);
  }
}
}  // namespace

Variable mul(const Variable& a, const Variable& b) {
  ProfileScope prof("mul.fwd");
  check_f32("mul", {&a, &b});
  Tensor y = activation_like(a.shape(), DType::f32);
  if (a.shape() == b.shape()) {
    kernels::mul(y, a.value(), b.value());
    return record("mul", {a, b}, y, [av = a.value(), bv = b.value()](const Tensor& dy, GradSink& g) {
      ProfileScope prof_bwd("mul.bwd");
      Tensor da = g.grad(0), db = g.grad(1);
      kernels::mul_backward(da, db, dy, av, bv);
    });
  }
  const Broadcast br = broadcast_of(a.shape(), b.shape());
  const int64_t d = a.shape().back(), rows = a.value().numel() / std::max<int64_t>(d, 1);
  const float *ap = a.value().data<float>(), *bp = b.value().data<float>();
  float* yp = y.data<float>();
  for_each_broadcast(bp, br, rows, d, [&](int64_t k, float bv) { yp[k] = ap[k] * bv; });
  return record("mul", {a, b}, y, [av = a.value(), bv = b.value(), br, d, rows](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("mul.bwd");
    const Tensor dyc = dy.contiguous();
    const float *dp = dyc.data<float>(), *a_in = av.data<float>(), *b_in = bv.data<float>();
    if (g.needs(0)) {
      Tensor da = g.grad(0);
      float* dap = da.data<float>();
      for_each_broadcast(b_in, br, rows, d, [&](int64_t k, float b_value) { dap[k] += dp[k] * b_value; });
    }
    if (g.needs(1)) {
      Tensor db = g.grad(1);
      sum_into_broadcast(db, dp, a_in, br, rows, d);
    }
  });
}

Variable add_broadcast(const Variable& a, const Variable& b) {
  if (a.shape() == b.shape()) return add(a, b);
  ProfileScope prof("add_broadcast.fwd");
  check_f32("add_broadcast", {&a, &b});
  Tensor y = activation_like(a.shape(), DType::f32);
  const Broadcast br = broadcast_of(a.shape(), b.shape());
  const int64_t d = a.shape().back(), rows = a.value().numel() / std::max<int64_t>(d, 1);
  const float *ap = a.value().data<float>(), *bp = b.value().data<float>();
  float* yp = y.data<float>();
  for_each_broadcast(bp, br, rows, d, [&](int64_t k, float bv) { yp[k] = ap[k] + bv; });
  return record("add_broadcast", {a, b}, y, [br, d, rows](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("add_broadcast.bwd");
    const Tensor dyc = dy.contiguous();
    if (g.needs(0)) {
      Tensor da = g.grad(0);
      accumulate(da, dyc);
    }
    if (g.needs(1)) {
      Tensor db = g.grad(1);
      sum_into_broadcast(db, dyc.data<float>(), nullptr, br, rows, d);
    }
  });
}

Variable add_scalar(const Variable& x, double c) {
  ProfileScope prof("add_scalar.fwd");
  check_f32("add_scalar", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
  const int64_t n = y.numel();
  const float cf = float(c);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] + cf;
  return record("add_scalar", {x}, y, [](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("add_scalar.bwd");
    if (g.adopt(0, dy)) return;
    Tensor dx = g.grad(0);
    accumulate(dx, dy);
  });
}

namespace {

// y = f(x) element-wise, for a function whose derivative is a function of y alone, dy/dx = g(y).
// fwd and bwd name the op's profile spans (string literals).
template <class F, class G>
Variable elementwise(const char* name, const char* fwd, const char* bwd, const Variable& x, F f, G g) {
  ProfileScope prof(fwd);
  check_f32(name, {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
  const int64_t n = y.numel();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) yp[i] = f(xp[i]);
  return record(name, {x}, y, [y, g, bwd](const Tensor& dy, GradSink& sink) {
    ProfileScope prof_bwd(bwd);
    Tensor dx = sink.grad(0);
    const Tensor dyc = dy.contiguous();
    const float *dp = dyc.data<float>(), *out = y.data<float>();
    float* dxp = dx.data<float>();
    const int64_t count = dx.numel();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) dxp[i] += g(out[i]) * dp[i];
  });
}

}  // namespace

Variable rsqrt(const Variable& x) {
  // d/dx x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3
  return elementwise("rsqrt", "rsqrt.fwd", "rsqrt.bwd", x, [](float v) { return 1.0f / std::sqrt(v); },
                     [](float y) { return -0.5f * y * y * y; });
}

Variable reciprocal(const Variable& x) {
  // d/dx 1/x = -1/x^2 = -y^2
  return elementwise("reciprocal", "reciprocal.fwd", "reciprocal.bwd", x, [](float v) { return 1.0f / v; },
                     [](float y) { return -y * y; });
}

Variable sigmoid(const Variable& x) {
  // d/dx sigmoid = y (1 - y)
  return elementwise("sigmoid", "sigmoid.fwd", "sigmoid.bwd", x, [](float v) { return 1.0f / (1.0f + std::exp(-v)); },
                     [](float y) { return y * (1.0f - y); });
}

Variable mean_last(const Variable& x) {
  ProfileScope prof("mean_last.fwd");
  check_f32("mean_last", {&x});
  Shape ys = x.shape();
  const int64_t d = ys.back(), rows = x.value().numel() / d;
  ys[ys.size() - 1] = 1;
  Tensor y = activation_like(ys, DType::f32);
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (int64_t i = 0; i < d; ++i) total += xp[r * d + i];
    yp[r] = float(total / double(d));
  }
  return record("mean_last", {x}, y, [d, rows](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("mean_last.bwd");
    Tensor dx = g.grad(0);
    const Tensor dyc = dy.contiguous();
    const float* dp = dyc.data<float>();
    float* dxp = dx.data<float>();
    const float inv = 1.0f / float(d);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < d; ++i) dxp[r * d + i] += dp[r] * inv;
  });
}

namespace {
// x viewed as [outer, size, inner] around dim (negative: from the end).
struct AroundDim {
  int dim = 0;
  int64_t outer = 1, size = 0, inner = 1;
};
AroundDim around_dim(const Shape& s, int dim, const char* op) {
  const int n = int(s.size());
  if (dim < 0) dim += n;
  TITAN_CHECK(dim >= 0 && dim < n, std::string(op) + ": dim out of range for " + s.str(), "pass a dim in [-rank, rank)");
  AroundDim a;
  a.dim = dim;
  a.size = s[dim];
  for (int d = 0; d < dim; ++d) a.outer *= s[d];
  for (int d = dim + 1; d < n; ++d) a.inner *= s[d];
  return a;
}

// dst [outer, dst_size, inner] at [dst_start, +length) (+)= src [outer, src_size, inner] at
// [src_start, +length).
void copy_along(float* dst, const AroundDim& dst_at, int64_t dst_start, const float* src, const AroundDim& src_at,
                int64_t src_start, int64_t length, bool add) {
  const int64_t run = length * dst_at.inner;
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < dst_at.outer; ++o) {
    float* d = dst + (o * dst_at.size + dst_start) * dst_at.inner;
    const float* s = src + (o * src_at.size + src_start) * src_at.inner;
    if (add)
      for (int64_t i = 0; i < run; ++i) d[i] += s[i];
    else
      std::memcpy(d, s, size_t(run) * sizeof(float));
  }
}
}  // namespace

Variable narrow_rows_view(const Variable& x, int64_t start, int64_t length) {
  check_f32("narrow_rows_view", {&x});
  TITAN_CHECK(x.value().is_contiguous() && !x.shape().empty() && start >= 0 && length >= 0 &&
                  start + length <= x.shape()[0],
              "narrow_rows_view: rows [" + std::to_string(start) + ", " + std::to_string(start + length) + ") of " +
                  x.shape().str(),
              "pass a contiguous tensor and a range inside its first dim");
  const int64_t row = length == 0 ? 0 : x.value().numel() / x.shape()[0];
  return record("narrow_rows_view", {x}, x.value().narrow(0, start, length), [start, row](const Tensor& dy, GradSink& g) {
    Tensor dx = g.grad(0);
    const Tensor dyc = dy.contiguous();
    float* out = dx.data<float>() + start * row;
    const float* in = dyc.data<float>();
    for (int64_t i = 0; i < dyc.numel(); ++i) out[i] += in[i];
  });
}

Variable narrow(const Variable& x, int dim, int64_t start, int64_t length) {
  ProfileScope prof("narrow.fwd");
  check_f32("narrow", {&x});
  const AroundDim xa = around_dim(x.shape(), dim, "narrow");
  TITAN_CHECK(start >= 0 && length >= 0 && start + length <= xa.size,
              "narrow: [" + std::to_string(start) + ", " + std::to_string(start + length) + ") of dim " +
                  std::to_string(xa.dim) + " of " + x.shape().str(),
              "pick a range inside the dim");
  Shape ys = x.shape();
  ys[xa.dim] = length;
  Tensor y = activation_like(ys, DType::f32);
  AroundDim ya = xa;
  ya.size = length;
  copy_along(y.data<float>(), ya, 0, x.value().data<float>(), xa, start, length, false);
  return record("narrow", {x}, y, [xa, ya, start, length](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("narrow.bwd");
    Tensor dx = g.grad(0);
    const Tensor dyc = dy.contiguous();
    copy_along(dx.data<float>(), xa, start, dyc.data<float>(), ya, 0, length, true);
  });
}

Variable concat(const std::vector<Variable>& parts, int dim) {
  ProfileScope prof("concat.fwd");
  TITAN_CHECK(!parts.empty(), "concat: no parts", "pass at least one tensor");
  const AroundDim first = around_dim(parts[0].shape(), dim, "concat");
  int64_t total = 0;
  for (const Variable& p : parts) {
    check_f32("concat", {&p});
    Shape expect = parts[0].shape();
    expect[first.dim] = p.shape().size() == expect.size() ? p.shape()[first.dim] : -1;
    TITAN_CHECK(p.shape() == expect, "concat: " + p.shape().str() + " does not join " + parts[0].shape().str(),
                "all dims but the joined one must be equal");
    total += p.shape()[first.dim];
  }
  Shape ys = parts[0].shape();
  ys[first.dim] = total;
  Tensor y = activation_like(ys, DType::f32);
  AroundDim ya = first;
  ya.size = total;
  std::vector<AroundDim> pa;
  int64_t at = 0;
  for (const Variable& p : parts) {
    pa.push_back(first);
    pa.back().size = p.shape()[first.dim];
    copy_along(y.data<float>(), ya, at, p.value().data<float>(), pa.back(), 0, pa.back().size, false);
    at += pa.back().size;
  }
  return record("concat", parts, {y}, [ya, pa](std::span<const Tensor> dys, GradSink& g) {
    ProfileScope prof_bwd("concat.bwd");
    const Tensor dyc = dys[0].contiguous();
    int64_t from = 0;
    for (size_t i = 0; i < pa.size(); ++i) {
      if (g.needs(i)) {
        Tensor dp = g.grad(i);
        copy_along(dp.data<float>(), pa[i], 0, dyc.data<float>(), ya, from, pa[i].size, true);
      }
      from += pa[i].size;
    }
  })[0];
}

namespace {
// dst rows [rows, width] += src rows [M, width] by index (i32 [M]): each destination row sums its
// sources in index order (a CSR of sources per row), so the result does not depend on threads.
void add_rows_by_index(float* dst, int64_t rows, const float* src, const Tensor& index, int64_t width) {
  const int32_t* idx = index.data<int32_t>();
  const int64_t m = index.numel();
  std::vector<int64_t> start(static_cast<size_t>(rows) + 1, 0), sources(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    TITAN_CHECK(idx[i] >= 0 && idx[i] < rows, "index_add: index " + std::to_string(idx[i]) + " outside [0, " +
                                                   std::to_string(rows) + ")", "indices address rows of the result");
    ++start[size_t(idx[i]) + 1];
  }
  for (int64_t r = 0; r < rows; ++r) start[size_t(r) + 1] += start[size_t(r)];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < m; ++i) sources[size_t(fill[size_t(idx[i])]++)] = i;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t s = start[size_t(r)]; s < start[size_t(r) + 1]; ++s) {
      const float* from = src + sources[size_t(s)] * width;
      float* to = dst + r * width;
      for (int64_t i = 0; i < width; ++i) to[i] += from[i];
    }
}

// dst [M, width] = src rows [rows, width] at index (i32 [M]).
void select_rows(float* dst, const float* src, int64_t rows, const Tensor& index, int64_t width) {
  const int32_t* idx = index.data<int32_t>();
  const int64_t m = index.numel();
  for (int64_t i = 0; i < m; ++i)
    TITAN_CHECK(idx[i] >= 0 && idx[i] < rows, "index_select: index " + std::to_string(idx[i]) + " outside [0, " +
                                                   std::to_string(rows) + ")", "indices address rows of x");
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < m; ++i) std::memcpy(dst + i * width, src + int64_t(idx[i]) * width, size_t(width) * sizeof(float));
}
}  // namespace

Variable index_select(const Variable& x, const Tensor& index) {
  ProfileScope prof("index_select.fwd");
  check_f32("index_select", {&x});
  TITAN_CHECK(index.dtype() == DType::i32 && index.is_contiguous(), "index_select: index " + index.str(),
              "pass contiguous i32 indices");
  const int64_t rows = x.shape()[0], width = x.value().numel() / std::max<int64_t>(rows, 1);
  Shape ys = x.shape();
  ys[0] = index.numel();
  Tensor y = activation_like(ys, DType::f32);
  select_rows(y.data<float>(), x.value().data<float>(), rows, index, width);
  return record("index_select", {x}, y, [index, rows, width](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("index_select.bwd");
    Tensor dx = g.grad(0);
    const Tensor dyc = dy.contiguous();
    add_rows_by_index(dx.data<float>(), rows, dyc.data<float>(), index, width);
  });
}

Variable index_add(int64_t rows, const Tensor& index, const Variable& src) {
  ProfileScope prof("index_add.fwd");
  check_f32("index_add", {&src});
  TITAN_CHECK(index.dtype() == DType::i32 && index.is_contiguous() && index.numel() == src.shape()[0],
              "index_add: index " + index.str() + " for source " + src.value().str(),
              "pass contiguous i32 indices, one per source row");
  const int64_t width = src.value().numel() / std::max<int64_t>(src.shape()[0], 1);
  Shape ys = src.shape();
  ys[0] = rows;
  Tensor y = Tensor::zeros(ys, DType::f32, MemCategory::activations);
  add_rows_by_index(y.data<float>(), rows, src.value().data<float>(), index, width);
  return record("index_add", {src}, y, [index, rows, width](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("index_add.bwd");
    const Tensor dyc = dy.contiguous();
    Tensor picked = Tensor::empty({index.numel(), width}, DType::f32, MemCategory::temporaries);
    select_rows(picked.data<float>(), dyc.data<float>(), rows, index, width);
    Tensor dsrc = g.grad(0);
    Tensor flat = dsrc.view({index.numel(), width});
    accumulate(flat, picked);
  });
}

namespace {
// x (contiguous) with dims d0 and d1 swapped, as a new contiguous tensor. Adjacent dims above the
// last move whole rows of the trailing dims (a memcpy each: the common [B, S, H, D] <-> [B, H, S, D]
// case); anything else takes Tensor's strided copy.
Tensor swapped_copy(const Tensor& x, int d0, int d1) {
  if (d0 > d1) std::swap(d0, d1);
  if (d1 != d0 + 1 || d1 == x.dim() - 1 || !x.is_contiguous()) return x.transpose(d0, d1).contiguous();
  const int64_t p = x.size(d0), q = x.size(d1);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < d0; ++d) outer *= x.size(d);
  for (int d = d1 + 1; d < x.dim(); ++d) inner *= x.size(d);
  Shape ys = x.shape();
  std::swap(ys[d0], ys[d1]);
  Tensor y = Tensor::empty(ys, x.dtype(), MemCategory::activations);
  const size_t row = size_t(inner) * dtype_bits(x.dtype()) / 8;
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(y.data_ptr());
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < p; ++i)
      for (int64_t j = 0; j < q; ++j) std::memcpy(dst + ((o * q + j) * p + i) * row, src + ((o * p + i) * q + j) * row, row);
  return y;
}
}  // namespace

Variable transpose(const Variable& x, int d0, int d1) {
  ProfileScope prof("transpose.fwd");
  check_f32("transpose", {&x});
  Tensor y = swapped_copy(x.value(), d0, d1);
  return record("transpose", {x}, y, [d0, d1](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("transpose.bwd");
    const Tensor back = swapped_copy(dy.contiguous(), d0, d1);
    if (g.adopt(0, back)) return;
    Tensor dx = g.grad(0);
    accumulate(dx, back);
  });
}

namespace {
// Calls f(element, keep) for every element of x under masked_fill's broadcast of keep.
template <class F>
void for_each_masked(const Shape& xs, const Tensor& keep, F f) {
  const bool broadcast = keep.shape() != xs;
  TITAN_CHECK(keep.dtype() == DType::u8 && keep.is_contiguous() && keep.dim() == int(xs.size()) &&
                  (!broadcast || (xs.size() >= 2 && keep.size(0) == xs[0] && keep.size(1) == 1 &&
                                  keep.numel() * xs[1] == xs.numel())),
              "masked_fill: mask " + keep.str() + " does not fit x " + xs.str(),
              "the mask is u8 with x's shape, or with 1 in dim 1 (broadcast over heads)");
  const uint8_t* k = keep.data<uint8_t>();
  const int64_t outer = xs[0], groups = broadcast ? xs[1] : 1, inner = xs.numel() / (outer * groups);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t h = 0; h < groups; ++h)
      for (int64_t i = 0; i < inner; ++i) f((o * groups + h) * inner + i, k[o * inner + i] != 0);
}
}  // namespace

Variable masked_fill(const Variable& x, const Tensor& keep, double value) {
  ProfileScope prof("masked_fill.fwd");
  check_f32("masked_fill", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
  const float v = float(value);
  for_each_masked(x.shape(), keep, [&](int64_t e, bool kept) { yp[e] = kept ? xp[e] : v; });
  return record("masked_fill", {x}, y, [keep](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("masked_fill.bwd");
    Tensor dx = g.grad(0);
    const float* d = dy.data<float>();
    float* dxp = dx.data<float>();
    for_each_masked(dx.shape(), keep, [&](int64_t e, bool kept) {
      if (kept) dxp[e] += d[e];
    });
  });
}

Variable softmax(const Variable& x) {
  ProfileScope prof("softmax.fwd");
  check_f32("softmax", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  kernels::softmax_forward(y, x.value());
  return record("softmax", {x}, y, [y](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("softmax.bwd");
    Tensor dx = g.grad(0);
    kernels::softmax_backward(dx, dy.contiguous(), y);
  });
}

Variable sinkhorn(const Variable& logits, int iters, double eps) {
  ProfileScope prof("sinkhorn.fwd");
  check_f32("sinkhorn", {&logits});
  const Tensor l = logits.value().contiguous();
  Tensor p = activation_like(l.shape(), DType::f32);
  kernels::sinkhorn_forward(p, l, iters, eps);
  return record("sinkhorn", {logits}, p, [l, iters, eps](const Tensor& dp, GradSink& g) {
    ProfileScope prof_bwd("sinkhorn.bwd");
    Tensor dl = g.grad(0);
    if (dl.defined()) kernels::sinkhorn_backward(dl, dp.contiguous(), l, iters, eps);
  });
}

Variable compressor(const Variable& kv, const Variable& gate, const Variable& bias, int64_t m,
                    kernels::CompressorKind kind) {
  ProfileScope prof("compressor.fwd");
  check_f32("compressor", {&kv, &gate, &bias});
  const Tensor k = kv.value().contiguous(), g = gate.value().contiguous(), b = bias.value().contiguous();
  const int64_t d = kind == kernels::CompressorKind::hca ? k.size(2) : k.size(2) / 2;
  Tensor out = activation_like({k.size(0), k.size(1) / m, d}, DType::f32);
  kernels::compressor_forward(out, k, g, b, m, kind);
  return record("compressor", {kv, gate, bias}, out, [k, g, b, m, kind](const Tensor& dout, GradSink& sink) {
    ProfileScope prof_bwd("compressor.bwd");
    // The kernel writes the three gradients together: scratch for those not wanted.
    Tensor dkv = sink.grad(0), dgate = sink.grad(1), dbias = sink.grad(2);
    if (!dkv.defined()) dkv = Tensor::zeros(k.shape(), DType::f32);
    if (!dgate.defined()) dgate = Tensor::zeros(g.shape(), DType::f32);
    if (!dbias.defined()) dbias = Tensor::zeros(b.shape(), DType::f32);
    kernels::compressor_backward(dkv, dgate, dbias, dout.contiguous(), k, g, b, m, kind);
  });
}

Variable v4_attention(const Variable& q, const Variable& kv, const Variable& comp, const Tensor& idx,
                      const Variable& sink, int64_t window, int64_t ratio, double scale, Tensor* head_mean_out,
                      int64_t pos0) {
  ProfileScope prof("v4_attention.fwd");
  const Tensor qv = q.value().contiguous(), kvv = kv.value().contiguous(), cv = comp.value().contiguous();
  const Tensor sv = sink.value().contiguous(), iv = idx.defined() ? idx.contiguous() : Tensor();
  const std::vector<Tensor> out = keep_or_compute([&] {
    Tensor o = activation_like(qv.shape(), qv.dtype());
    Tensor lse = Tensor::empty({qv.size(0), qv.size(1), qv.size(2)}, DType::f32, MemCategory::activations);
    std::vector<Tensor> result{o, lse};
    if (head_mean_out) {
      TITAN_CHECK(iv.defined(), "v4_attention: head_mean_out asked of an HCA layer (no idx)",
                  "the indexer's target exists on CSA layers only");
      result.push_back(Tensor::empty({qv.size(0), qv.size(1), iv.size(2)}, DType::f32, MemCategory::activations));
    }
    kernels::v4_attention_forward(o, lse, qv, kvv, cv, iv, sv, window, ratio, scale,
                                  head_mean_out ? &result[2] : nullptr, pos0);
    return result;
  });
  const Tensor &o = out[0], &lse = out[1];
  if (head_mean_out) *head_mean_out = out.at(2);
  return record("v4_attention", {q, kv, comp, sink}, o,
                [qv, kvv, cv, iv, sv, o, lse, window, ratio, scale, pos0](const Tensor& dout, GradSink& g) {
                  ProfileScope prof_bwd("v4_attention.bwd");
                  // The kernel overwrites all four gradients: fresh buffers, adopted by an input
                  // with no gradient yet (the usual case: no zero-fill, no read-back), else added.
                  Tensor dq = Tensor::empty(qv.shape(), qv.dtype()), dkv = Tensor::empty(kvv.shape(), kvv.dtype());
                  Tensor dc = Tensor::empty(cv.shape(), cv.dtype()), ds = Tensor::empty(sv.shape(), DType::f32);
                  kernels::v4_attention_backward(dq, dkv, dc, ds, dout.contiguous(), qv, kvv, cv, iv, sv, o, lse, window,
                                                 ratio, scale, pos0);
                  const Tensor grads[] = {dq, dkv, dc, ds};
                  for (size_t i = 0; i < 4; ++i) {
                    if (!g.needs(i) || g.adopt(i, grads[i])) continue;
                    Tensor acc = g.grad(i);  // a leaf's is f32 whatever its value's dtype
                    accumulate(acc, grads[i].dtype() == acc.dtype() ? grads[i] : grads[i].to(acc.dtype()));
                  }
                });
}

Variable log_softmax(const Variable& x) {
  ProfileScope prof("log_softmax.fwd");
  check_f32("log_softmax", {&x});
  Tensor y = activation_like(x.shape(), DType::f32);
  const int64_t d = x.value().size(-1), rows = x.value().numel() / d;
  const float* xp = x.value().data<float>();
  float* yp = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xp + r * d;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < d; ++i) m = std::max(m, xr[i]);
    double sum = 0;
    if (m != -std::numeric_limits<float>::infinity())
      for (int64_t i = 0; i < d; ++i) sum += std::exp(double(xr[i]) - m);
    // An all -inf row stays -inf (log of an empty sum), so its gradient is 0 below.
    const float lse = sum > 0 ? float(m + std::log(sum)) : std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < d; ++i) yp[r * d + i] = xr[i] - lse;
  }
  return record("log_softmax", {x}, y, [y, d, rows](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("log_softmax.bwd");
    // dx = dy - softmax(x) * sum(dy), with softmax = exp(y) (0 at -inf entries).
    Tensor dx = g.grad(0);
    const Tensor dyc = dy.contiguous();
    const float* out = y.data<float>();
    const float* d_ = dyc.data<float>();
    float* dxp = dx.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      double total = 0;
      for (int64_t i = 0; i < d; ++i) total += d_[r * d + i];
      for (int64_t i = 0; i < d; ++i) {
        const float yi = out[r * d + i];
        const float p = yi == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(yi);
        dxp[r * d + i] += d_[r * d + i] - float(p * total);
      }
    }
  });
}

Variable sum(const Variable& x) {
  ProfileScope prof("sum.fwd");
  check_f32("sum", {&x});
  double total = 0;
  const float* xp = x.value().data<float>();
  for (int64_t i = 0; i < x.value().numel(); ++i) total += xp[i];
  return record("sum", {x}, Tensor::full({1}, total, DType::f32), [](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("sum.bwd");
    Tensor dx = g.grad(0);
    const float d = float(dy.item());
    float* dxp = dx.data<float>();
    for (int64_t i = 0; i < dx.numel(); ++i) dxp[i] += d;
  });
}

Variable cast(const Variable& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  ProfileScope prof("cast.fwd");
  return record("cast", {x}, x.value().to(dtype, MemCategory::activations), [from = x.dtype()](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("cast.bwd");
    const Tensor back = dy.to(from);
    if (g.adopt(0, back)) return;
    Tensor dx = g.grad(0);
    accumulate(dx, back);
  });
}

}  // namespace titan::autograd
