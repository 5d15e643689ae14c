// How one (batched) matmul call lays out its operands. Shared by the oneDNN path, the reference
// twin and the Tensor-level API, so the layouts a linear layer's forward and backward use are
// derived in one place (and the gradient check of the reference checks the same derivation).
#pragma once

#include <cstdint>

namespace titan::kernels {

// C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b]   (+ bias[N] on every row, when given)
// op(A[b]) is [M, K], op(B[b]) is [K, N], C[b] is [M, N]; all row-major with unit inner stride.
struct MatmulParams {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false;  // A[b] is stored [K, M] and used transposed
  bool trans_b = false;  // B[b] is stored [N, K] and used transposed (a linear layer's weight)
  int64_t lda = 0, ldb = 0, ldc = 0;  // elements between rows of A, B, C as stored
  // Elements between consecutive batches; 0 on A or B shares one matrix across the batch
  // (a linear layer applied to a batch). C always has its own matrix per batch.
  int64_t batch_stride_a = 0, batch_stride_b = 0, batch_stride_c = 0;
  float alpha = 1, beta = 0;  // beta == 0: C is written without being read (it may hold garbage)

  // Row lengths of A and B as stored (what lda and ldb must cover).
  int64_t a_cols() const { return trans_a ? m : k; }
  int64_t b_cols() const { return trans_b ? k : n; }
};

// Dense row-major operands with no padding: every leading dimension is its row length and every
// batch stride its matrix size (B's is 0 when it is shared).
inline MatmulParams dense_matmul_params(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                        bool share_b = false) {
  MatmulParams p;
  p.batch = batch, p.m = m, p.n = n, p.k = k, p.trans_a = trans_a, p.trans_b = trans_b;
  p.lda = p.a_cols(), p.ldb = p.b_cols(), p.ldc = n;
  p.batch_stride_a = m * k, p.batch_stride_b = share_b ? 0 : k * n, p.batch_stride_c = m * n;
  return p;
}

// ---- a linear layer y = x @ w^T + bias, with rows = tokens -------------------------------------
// y[rows, out] = x[rows, in] @ w[out, in]^T
inline MatmulParams linear_forward_params(int64_t rows, int64_t in, int64_t out) {
  return dense_matmul_params(1, rows, out, in, false, true);
}
// dx[rows, in] += dy[rows, out] @ w[out, in]
inline MatmulParams linear_dx_params(int64_t rows, int64_t in, int64_t out) {
  MatmulParams p = dense_matmul_params(1, rows, in, out, false, false);
  p.beta = 1;
  return p;
}
// dw[out, in] += dy[rows, out]^T @ x[rows, in]: the token sum is the K of this product, so it
// runs in the GEMM's f32 accumulators even when dy and x are bf16.
inline MatmulParams linear_dw_params(int64_t rows, int64_t in, int64_t out) {
  MatmulParams p = dense_matmul_params(1, out, in, rows, true, false);
  p.beta = 1;
  return p;
}

}  // namespace titan::kernels
