#include "titan/autograd/ops.h"

#include "titan/core/profiler.h"

#include "titan/kernels/activation.h"
#include "titan/kernels/attention.h"
#include "titan/kernels/columns.h"
#include "titan/kernels/cross_entropy.h"
#include "titan/kernels/elementwise.h"
#include "titan/kernels/embedding.h"
#include "titan/kernels/matmul.h"
#include "titan/kernels/norm.h"

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
  Shape ys = x.shape();
  ys[ys.size() - 1] = wc.size(0);
  // The GEMM's inputs share one dtype: an f32 master weight with bf16 activations needs a compute copy.
  TITAN_CHECK(wc.dtype() == x.dtype(), "linear: activations are " + std::string(dtype_name(x.dtype())) +
                                           " but the weight is " + std::string(dtype_name(wc.dtype())),
              "pass the weight's compute copy for mixed precision");
  Tensor y = activation_like(ys, x.dtype());
  kernels::linear_forward(y, x.value(), wc);
  return record("linear", {x, w}, y, [xv = x.value(), wc](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("linear.bwd");
    Tensor dx = g.grad(0), dw = g.grad(1), db;
    kernels::linear_backward(dx, dw, db, dy, xv, wc);
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

Variable rope(const Variable& x, const kernels::RopeTables& tables, const Tensor& positions, kernels::RopeLayout layout,
              int64_t rope_offset) {
  ProfileScope prof("rope.fwd");
  Tensor y = activation_like(x.shape(), x.dtype());
  kernels::rope_forward(y, x.value(), tables, positions, layout, rope_offset);
  return record("rope", {x}, y, [tables, positions, layout, rope_offset](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("rope.bwd");
    Tensor dx = g.grad(0);
    kernels::rope_backward(dx, dy, tables, positions, layout, rope_offset);
  });
}

Variable attention(const Variable& q, const Variable& k, const Variable& v, std::optional<double> scale) {
  ProfileScope prof("attention.fwd");
  const Tensor& qv = q.value();
  Shape os = qv.shape();
  os[3] = v.value().size(3);
  Tensor o = activation_like(os, qv.dtype());
  Tensor lse = Tensor::empty({qv.size(0), qv.size(2), qv.size(1)}, DType::f32, MemCategory::activations);
  kernels::attention_forward(o, lse, qv, k.value(), v.value(), scale);
  return record("attention", {q, k, v}, o,
                [qv, kv = k.value(), vv = v.value(), o, lse, scale](const Tensor& dout, GradSink& g) {
    ProfileScope prof_bwd("attention.bwd");
                  Tensor dq = g.grad(0), dk = g.grad(1), dv = g.grad(2);
                  kernels::attention_backward(dq, dk, dv, lse, dout, qv, kv, vv, o, scale);
                });
}

Variable swiglu(const Variable& gate, const Variable& up) {
  ProfileScope prof("swiglu.fwd");
  Tensor y = activation_like(gate.shape(), gate.dtype());
  kernels::swiglu_forward(y, gate.value(), up.value());
  return record("swiglu", {gate, up}, y, [gv = gate.value(), uv = up.value()](const Tensor& dy, GradSink& g) {
    ProfileScope prof_bwd("swiglu.bwd");
    Tensor dgate = g.grad(0), dup = g.grad(1);
    kernels::swiglu_backward(dgate, dup, dy, gv, uv);
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

}  // namespace titan::autograd
