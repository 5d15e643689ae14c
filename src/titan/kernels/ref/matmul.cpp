#include "titan/kernels/ref/matmul.h"

namespace titan::kernels::ref {

template <class TC, class T>
void matmul(TC* c, const T* a, const T* b, const TC* bias, const MatmulParams& p) {
  using acc = acc_t<T>;
  const acc alpha = acc(p.alpha), beta = acc(p.beta);
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    const T* ab = a + bi * p.batch_stride_a;  // A[b]
    const T* bb = b + bi * p.batch_stride_b;  // B[b]
    TC* cb = c + bi * p.batch_stride_c;       // C[b]
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < p.n; ++j) {
        acc sum = 0;
        for (int64_t kk = 0; kk < p.k; ++kk) {
          const acc av = load(p.trans_a ? ab[kk * p.lda + i] : ab[i * p.lda + kk]);
          const acc bv = load(p.trans_b ? bb[j * p.ldb + kk] : bb[kk * p.ldb + j]);
          sum += av * bv;
        }
        acc v = alpha * sum;
        if (bias) v += load(bias[j]);
        // beta == 0 never reads C, so garbage (even NaN) in an output buffer does not leak in.
        if (beta != 0) v += beta * load(cb[i * p.ldc + j]);
        cb[i * p.ldc + j] = store<TC>(v);
      }
    }
  }
}

template <class T>
void matmul_backward(T* da, T* db, const T* dc, const T* a, const T* b, int64_t batch, int64_t m, int64_t n,
                     int64_t k, bool trans_a, bool trans_b, bool share_b, float alpha) {
  auto operand = [&](MatmulOperand o) { return o == MatmulOperand::a ? a : o == MatmulOperand::b ? b : dc; };
  if (da) {
    const MatmulGradStep s = matmul_grad_a_step(batch, m, n, k, trans_a, trans_b, share_b, alpha);
    matmul<T, T>(da, operand(s.lhs), operand(s.rhs), nullptr, s.p);
  }
  if (db) {
    const MatmulGradStep s = matmul_grad_b_step(batch, m, n, k, trans_a, trans_b, share_b, alpha);
    matmul<T, T>(db, operand(s.lhs), operand(s.rhs), nullptr, s.p);
  }
}

template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int64_t rows, int64_t in, int64_t out) {
  matmul<T, T>(y, x, w, bias, linear_forward_params(rows, in, out));
}

template <class T>
void linear_backward(T* dx, acc_t<T>* dw, acc_t<T>* db, const T* dy, const T* x, const T* w, int64_t rows,
                     int64_t in, int64_t out) {
  if (dx) matmul<T, T>(dx, dy, w, nullptr, linear_dx_params(rows, in, out));
  if (dw) matmul<acc_t<T>, T>(dw, dy, x, nullptr, linear_dw_params(rows, in, out));
  if (db) linear_bias_backward(db, dy, rows, out);
}

template <class T>
void linear_bias_backward(acc_t<T>* db, const T* dy, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) db[j] += load(dy[r * cols + j]);
}

template void matmul<float, bf16>(float*, const bf16*, const bf16*, const float*, const MatmulParams&);
#define TITAN_INSTANTIATE(T)                                                                               \
  template void matmul<T, T>(T*, const T*, const T*, const T*, const MatmulParams&);                     \
  template void matmul_backward(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, bool, \
                                bool, bool, float);                                                       \
  template void linear_forward(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t);              \
  template void linear_backward(T*, acc_t<T>*, acc_t<T>*, const T*, const T*, const T*, int64_t, int64_t, \
                                int64_t);                                                                 \
  template void linear_bias_backward(acc_t<T>*, const T*, int64_t, int64_t);
TITAN_REF_FOR_EACH_TYPE(TITAN_INSTANTIATE)
#undef TITAN_INSTANTIATE

}  // namespace titan::kernels::ref
