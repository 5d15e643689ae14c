// Reference: batched matmul as a plain triple loop, and a linear layer's forward and backward
// built from it with the layouts of kernels/matmul_params.h. The oracle for the oneDNN path.
#pragma once

#include <cstdint>

#include "titan/kernels/matmul_params.h"
#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// c: C[b] per p; a, b: A and B as stored (p says how); bias: [N] or null (needs alpha == 1).
// Sums in acc_t<T> in k order. TC is T, or float when T is bf16 (bf16 inputs, f32 output).
template <class TC, class T>
void matmul(TC* c, const T* a, const T* b, const TC* bias, const MatmulParams& p);

// The backward of c = alpha * op(a) @ op(b) on dense operands (kernels/matmul_params.h):
// da += dC @ op(B)^T and db += op(A)^T @ dC, each in its input's stored layout; either may be
// null. share_b: one B for the whole batch (then trans_a must be false).
template <class T>
void matmul_backward(T* da, T* db, const T* dc, const T* a, const T* b, int64_t batch, int64_t m, int64_t n,
                     int64_t k, bool trans_a, bool trans_b, bool share_b, float alpha);

// y[rows, out] = x[rows, in] @ w[out, in]^T + bias[out]; bias may be null.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* bias, int64_t rows, int64_t in, int64_t out);

// dx[rows, in] += dy @ w;  dw[out, in] += dy^T @ x;  db[out] += column sums of dy.
// Each gradient may be null (not wanted). Weight and bias gradients are acc_t<T>.
template <class T>
void linear_backward(T* dx, acc_t<T>* dw, acc_t<T>* db, const T* dy, const T* x, const T* w, int64_t rows,
                     int64_t in, int64_t out);

// db[cols] += sum over rows of dy[rows, cols], row by row.
template <class T>
void linear_bias_backward(acc_t<T>* db, const T* dy, int64_t rows, int64_t cols);

}  // namespace titan::kernels::ref
