#include "titan/kernels/matmul.h"

#include <string>

#include "titan/kernels/cpu/matmul.h"
#include "titan/kernels/dispatch.h"
#include "titan/kernels/onednn/matmul.h"
#include "titan/kernels/ref/matmul.h"

namespace titan::kernels {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_params(DType c_type, DType ab_type, bool has_bias, const MatmulParams& p) {
  TITAN_CHECK(ab_type == DType::f32 || ab_type == DType::bf16,
              "matmul: inputs are " + std::string(dtype_name(ab_type)), "A and B must both be f32 or both bf16");
  TITAN_CHECK(c_type == DType::f32 || (c_type == DType::bf16 && ab_type == DType::bf16),
              "matmul: output " + std::string(dtype_name(c_type)) + " with " + std::string(dtype_name(ab_type)) +
                  " inputs",
              "C is f32, or bf16 when A and B are bf16");
  TITAN_CHECK(p.batch >= 0 && p.m >= 0 && p.n >= 0 && p.k >= 1,
              "matmul: bad sizes batch=" + str(p.batch) + " M=" + str(p.m) + " N=" + str(p.n) + " K=" + str(p.k),
              "K must be at least 1; batch, M and N may be 0 (nothing to do)");
  TITAN_CHECK(p.lda >= p.a_cols() && p.ldb >= p.b_cols() && p.ldc >= p.n,
              "matmul: leading dims lda=" + str(p.lda) + " ldb=" + str(p.ldb) + " ldc=" + str(p.ldc) +
                  " are shorter than the rows they step over (" + str(p.a_cols()) + ", " + str(p.b_cols()) + ", " +
                  str(p.n) + ")",
              "a leading dim is the distance between rows as stored; transposed operands store [K, M] / [N, K]");
  TITAN_CHECK(p.batch <= 1 || (p.batch_stride_a >= 0 && p.batch_stride_b >= 0 && p.batch_stride_c > 0),
              "matmul: batch strides must be >= 0 (A, B) and > 0 (C)", "only A and B may be shared across a batch");
  TITAN_CHECK(!has_bias || p.alpha == 1, "matmul: a bias with alpha != 1",
              "scale the bias yourself, or run the bias as a separate add");
}

// Where the last two dims of a tensor sit in memory: row-major with row stride ld, or
// "transposed" (the memory holds the [cols, rows] transpose row-major, with row stride ld).
// Leading dims are collapsed into one batch count and stride.
struct OperandLayout {
  bool transposed = false;
  int64_t ld = 0;
  int64_t batch = 1;
  int64_t batch_stride = 0;
};

OperandLayout layout_of(const Tensor& t, const char* name) {
  TITAN_CHECK(t.defined() && t.dim() >= 2, std::string("matmul: ") + name + " must have at least 2 dims",
              "pass matrices [rows, cols] or batches [..., rows, cols]");
  TITAN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16,
              std::string("matmul: ") + name + " is " + std::string(dtype_name(t.dtype())), "use f32 or bf16");
  OperandLayout l;
  const int64_t rows = t.size(-2), cols = t.size(-1);
  if (rows == 1) {
    l.ld = cols;  // one row: its stride to a next row is never used
  } else if (cols == 1 || t.stride(-1) == 1) {
    l.ld = t.stride(-2);
  } else if (t.stride(-2) == 1) {
    l.transposed = true;
    l.ld = t.stride(-1);
  }
  TITAN_CHECK(l.ld >= (l.transposed ? rows : cols) || (rows == 1 && !l.transposed),
              std::string("matmul: ") + name + " " + t.str() + " has no unit stride in its last two dims",
              "make it .contiguous() (a plain transpose() view is fine as is)");
  if (l.ld < 1) l.ld = 1;
  int64_t expected = 0;  // stride the next-outer batch dim must have to collapse with the inner ones
  for (int d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (expected == 0) {
      l.batch_stride = t.stride(d);
    } else {
      TITAN_CHECK(t.stride(d) == expected,
                  std::string("matmul: the batch dims of ") + name + " " + t.str() + " do not collapse to one stride",
                  "make it .contiguous()");
    }
    expected = t.stride(d) * t.size(d);
    l.batch *= t.size(d);
  }
  return l;
}

Shape batch_shape(const Tensor& t) {
  Shape s;
  for (int d = 0; d + 2 < t.dim(); ++d) s.push_back(t.size(d));
  return s;
}

void run(void* c, DType c_type, const void* a, const void* b, DType ab_type, const void* bias,
         const MatmulParams& p) {
  if (kernel_backend() == KernelBackend::fast) {
    onednn::matmul(c, c_type, a, b, ab_type, bias, p);
  } else if (ab_type == DType::f32) {
    ref::matmul<float, float>(static_cast<float*>(c), static_cast<const float*>(a), static_cast<const float*>(b),
                              static_cast<const float*>(bias), p);
  } else if (c_type == DType::f32) {
    ref::matmul<float, bf16>(static_cast<float*>(c), static_cast<const bf16*>(a), static_cast<const bf16*>(b),
                             static_cast<const float*>(bias), p);
  } else {
    ref::matmul<bf16, bf16>(static_cast<bf16*>(c), static_cast<const bf16*>(a), static_cast<const bf16*>(b),
                            static_cast<const bf16*>(bias), p);
  }
}

void matmul_tensors(Tensor& c, const Tensor& a, const Tensor& b, const Tensor& bias, bool trans_a, bool trans_b,
                    float alpha, float beta) {
  const OperandLayout la = layout_of(a, "A"), lb = layout_of(b, "B"), lc = layout_of(c, "C");
  TITAN_CHECK(a.dtype() == b.dtype(), "matmul: A is " + std::string(dtype_name(a.dtype())) + " but B is " +
                                          std::string(dtype_name(b.dtype())),
              "cast one of them (kernels::cast) so both are f32 or both bf16");
  MatmulParams p;
  p.m = trans_a ? a.size(-1) : a.size(-2);
  p.k = trans_a ? a.size(-2) : a.size(-1);
  p.n = trans_b ? b.size(-2) : b.size(-1);
  const int64_t kb = trans_b ? b.size(-1) : b.size(-2);
  TITAN_CHECK(kb == p.k && c.size(-2) == p.m && c.size(-1) == p.n,
              "matmul: shapes do not chain: op(A) is [" + str(p.m) + ", " + str(p.k) + "], op(B) is [" + str(kb) +
                  ", " + str(p.n) + "], C is " + c.shape().str(),
              "op(A) [M, K] @ op(B) [K, N] -> C [M, N]; check trans_a / trans_b");
  const Shape batch = a.dim() > 2 ? batch_shape(a) : batch_shape(b);
  TITAN_CHECK((a.dim() == 2 || batch_shape(a) == batch) && (b.dim() == 2 || batch_shape(b) == batch) &&
                  batch_shape(c) == batch,
              "matmul: batch dims differ: A " + a.shape().str() + ", B " + b.shape().str() + ", C " + c.shape().str(),
              "batched operands need identical leading dims; a 2-D A or B is shared across the batch");
  TITAN_CHECK(!lc.transposed, "matmul: C " + c.str() + " is stored transposed",
              "write into a row-major C (unit stride on its last dim)");
  p.batch = batch.numel();
  p.trans_a = trans_a != la.transposed;
  p.trans_b = trans_b != lb.transposed;
  p.lda = la.ld, p.ldb = lb.ld, p.ldc = lc.ld;
  p.batch_stride_a = la.batch_stride, p.batch_stride_b = lb.batch_stride, p.batch_stride_c = lc.batch_stride;
  p.alpha = alpha, p.beta = beta;
  if (bias.defined()) {
    TITAN_CHECK(bias.dim() == 1 && bias.size(0) == p.n && bias.is_contiguous() && bias.dtype() == c.dtype(),
                "matmul: bias " + bias.str() + " for output " + c.str(),
                "the bias is a contiguous [N] vector with the output's dtype");
  }
  check_params(c.dtype(), a.dtype(), bias.defined(), p);
  run(c.data_ptr(), c.dtype(), a.data_ptr(), b.data_ptr(), a.dtype(), bias.defined() ? bias.data_ptr() : nullptr,
      p);
}

// [..., D] -> [N, D] without copying.
Tensor rows_of(const Tensor& t, const char* name) {
  TITAN_CHECK(t.defined() && t.dim() >= 1, std::string("linear: ") + name + " is undefined or a scalar",
              "pass [N, features] (or [..., features])");
  if (t.dim() == 2) return t;
  TITAN_CHECK(t.is_contiguous(), std::string("linear: ") + name + " " + t.str() + " is not contiguous",
              "make it .contiguous() so its leading dims flatten into rows");
  return t.view({-1, t.size(-1)});
}

}  // namespace

void matmul(void* c, DType c_type, const void* a, const void* b, DType ab_type, const void* bias,
            const MatmulParams& p) {
  check_params(c_type, ab_type, bias != nullptr, p);
  run(c, c_type, a, b, ab_type, bias, p);
}

void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha, float beta) {
  matmul_tensors(c, a, b, Tensor(), trans_a, trans_b, alpha, beta);
}

void matmul_backward(Tensor& da, Tensor& db, const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a,
                     bool trans_b, float alpha) {
  for (const Tensor* t : {&dc, &a, &b}) {
    TITAN_CHECK(t->defined() && t->dim() >= 2 && t->is_contiguous(), "matmul_backward: operand " + t->str(),
                "a, b and dc must be contiguous matrices or batches of them");
  }
  TITAN_CHECK(a.dtype() == b.dtype() && dc.dtype() == a.dtype(),
              "matmul_backward: dtypes of dc, a, b differ (" + std::string(dtype_name(dc.dtype())) + ", " +
                  std::string(dtype_name(a.dtype())) + ", " + std::string(dtype_name(b.dtype())) + ")",
              "run the backward in the forward's compute dtype");
  const bool share_b = b.dim() == 2 && a.dim() > 2;
  TITAN_CHECK(!(share_b && trans_a) && (b.dim() == 2 || batch_shape(b) == batch_shape(a)),
              "matmul_backward: unsupported batching: a " + a.shape().str() + (trans_a ? " (transposed)" : "") +
                  ", b " + b.shape().str(),
              "a shared 2-D b needs an untransposed a; otherwise a and b need the same batch dims");
  const int64_t batch = batch_shape(a).numel();
  const int64_t m = trans_a ? a.size(-1) : a.size(-2), k = trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = trans_b ? b.size(-2) : b.size(-1);
  TITAN_CHECK((trans_b ? b.size(-1) : b.size(-2)) == k && dc.size(-2) == m && dc.size(-1) == n &&
                  batch_shape(dc) == batch_shape(a),
              "matmul_backward: shapes do not chain: a " + a.shape().str() + ", b " + b.shape().str() + ", dc " +
                  dc.shape().str(),
              "pass the forward's a, b, trans_a, trans_b and the gradient of its output");
  auto operand = [&](MatmulOperand o) { return (o == MatmulOperand::a ? a : o == MatmulOperand::b ? b : dc).data_ptr(); };
  auto step = [&](Tensor& grad, const Tensor& like, const MatmulGradStep& s) {
    if (!grad.defined()) return;
    TITAN_CHECK(grad.shape() == like.shape() && grad.is_contiguous(),
                "matmul_backward: gradient " + grad.str() + " for input " + like.str(),
                "a gradient is contiguous with its input's shape");
    matmul(grad.data_ptr(), grad.dtype(), operand(s.lhs), operand(s.rhs), a.dtype(), nullptr, s.p);
  };
  step(da, a, matmul_grad_a_step(batch, m, n, k, trans_a, trans_b, share_b, alpha));
  step(db, b, matmul_grad_b_step(batch, m, n, k, trans_a, trans_b, share_b, alpha));
}

void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias) {
  Tensor y2 = rows_of(y, "y");
  matmul_tensors(y2, rows_of(x, "x"), w, bias, false, true, 1, 0);
}

void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                     bool accumulate_dx, bool accumulate_dw) {
  const Tensor dy2 = rows_of(dy, "dy");
  if (dx.defined()) {
    Tensor dx2 = rows_of(dx, "dx");
    matmul_tensors(dx2, dy2, w, Tensor(), false, false, 1, accumulate_dx ? 1 : 0);
  }
  if (dw.defined()) matmul_tensors(dw, dy2, rows_of(x, "x"), Tensor(), true, false, 1, accumulate_dw ? 1 : 0);
  if (db.defined()) {
    TITAN_CHECK(db.dtype() == DType::f32 && db.dim() == 1 && db.size(0) == dy2.size(1) && db.is_contiguous() &&
                    dy2.is_contiguous(),
                "linear_backward: db " + db.str() + " for dy " + dy.str(),
                "db is a contiguous f32 [out] vector (bias gradients accumulate in f32); dy must be contiguous");
    const bool fast = kernel_backend() == KernelBackend::fast;
    const int64_t rows = dy2.size(0), cols = dy2.size(1);
    if (dy2.dtype() == DType::f32) {
      (fast ? TITAN_CPU_KERNEL(linear_bias_backward<float>) : &ref::linear_bias_backward<float>)(
          db.data<float>(), dy2.data<float>(), rows, cols);
    } else {
      TITAN_CHECK(dy2.dtype() == DType::bf16, "linear_backward: dy is " + std::string(dtype_name(dy2.dtype())),
                  "use f32 or bf16");
      (fast ? TITAN_CPU_KERNEL(linear_bias_backward<bf16>) : &ref::linear_bias_backward<bf16>)(
          db.data<float>(), dy2.data<bf16>(), rows, cols);
    }
  }
}

}  // namespace titan::kernels
