// Matrix multiplication (the linear layers' and attention's GEMMs): f32, or bf16 inputs with f32
// accumulation, optional transposes, batched with a shared B. The fast path is oneDNN
// (kernels/onednn/matmul.h); kernels/ref/matmul.h is the oracle.
#pragma once

#include "titan/core/tensor.h"
#include "titan/kernels/matmul_params.h"

namespace titan::kernels {

// Raw form: C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] (+ bias[N]); p gives the layout.
// ab_type f32 or bf16; c_type f32, or bf16 with bf16 inputs; bias (or null) has c_type and needs
// alpha == 1. Validates p, then runs the backend in use (kernel_backend()).
void matmul(void* c, DType c_type, const void* a, const void* b, DType ab_type, const void* bias,
            const MatmulParams& p);

// Tensor form of the same. a: [..., M, K] ([..., K, M] with trans_a); b: [..., K, N] ([..., N, K]
// with trans_b), or 2-D to share one B across the batch; c: [..., M, N] with the batch dims of a
// (or b). Leading batch dims must collapse to one stride. A transposed view (unit stride on the
// second-last dim) is taken as is: it folds into the transpose flag, nothing is copied.
void matmul(Tensor& c, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha = 1,
            float beta = 0);

// The backward of c = alpha * op(a) @ op(b):  da += alpha * dc @ op(b)^T,  db += alpha * op(a)^T @ dc,
// each laid out like a / b. Pass an undefined Tensor for a gradient that is not wanted. All
// operands contiguous; b may be 2-D, shared by a batched a (then trans_a must be false and db
// sums over the batch). Gradients have the inputs' dtype, or f32 (f32 accumulation for bf16).
void matmul_backward(Tensor& da, Tensor& db, const Tensor& dc, const Tensor& a, const Tensor& b, bool trans_a,
                     bool trans_b, float alpha = 1);

// y[N, out] = x[N, in] @ w[out, in]^T + bias[out]. x and y may have more leading dims (flattened
// into N; they must be contiguous); bias may be undefined (no bias) and has y's dtype.
void linear_forward(Tensor& y, const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// dx[N, in] += dy[N, out] @ w;  dw[out, in] += dy^T @ x;  db[out] += sum over N of dy.
// Pass an undefined Tensor for a gradient that is not wanted. dw and db should be f32 when x and
// dy are bf16: the sums over tokens then accumulate in f32 (db must be f32). With
// accumulate_dx (accumulate_dw) false, dx = dy @ w (dw = dy^T @ x) is written, not added: the
// buffer need not be initialized.
void linear_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dy, const Tensor& x, const Tensor& w,
                     bool accumulate_dx = true, bool accumulate_dw = true);

}  // namespace titan::kernels
