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
  // Run the product on the calling thread alone. For callers that spread independent products
  // over the threads themselves (grouped GEMMs run one expert per thread): oneDNN's own split of
  // a small product over two threads gains little (measured 1.09x on [384, 256] x [256, 256]).
  bool this_thread_only = false;

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

// ---- the backward of C = alpha * op(A) @ op(B) (dense operands) -------------------------------
// Each gradient is itself a matmul that accumulates (beta = 1) into a buffer laid out like its
// input:  dA += alpha * dC @ op(B)^T   and   dB += alpha * op(A)^T @ dC,
// each written in the stored (possibly transposed) orientation of A or B.
enum class MatmulOperand : uint8_t { a, b, dc };
struct MatmulGradStep {
  MatmulParams p;
  MatmulOperand lhs, rhs;  // the buffers that play A and B in p
};

// With share_b (one B for the whole batch), dB sums over the batch: that is one product over
// batch * M rows, which needs A stored untransposed (trans_a == false).
inline MatmulGradStep matmul_grad_a_step(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                         bool share_b, float alpha) {
  MatmulGradStep s;
  if (!trans_a) {  // dA[M, K] = dC[M, N] @ op(B)^T
    s = {dense_matmul_params(batch, m, k, n, false, !trans_b), MatmulOperand::dc, MatmulOperand::b};
    if (share_b) s.p.batch_stride_b = 0;
  } else {  // dA^T[K, M] = op(B)[K, N] @ dC^T
    s = {dense_matmul_params(batch, k, m, n, trans_b, true), MatmulOperand::b, MatmulOperand::dc};
    if (share_b) s.p.batch_stride_a = 0;
  }
  s.p.alpha = alpha, s.p.beta = 1;
  return s;
}

inline MatmulGradStep matmul_grad_b_step(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                         bool share_b, float alpha) {
  // A shared B collects every batch's rows: [batch * M] rows of A and dC in one product.
  const int64_t rows = share_b ? batch * m : m, b_batch = share_b ? 1 : batch;
  MatmulGradStep s;
  if (!trans_b) {  // dB[K, N] = op(A)^T[K, M] @ dC[M, N]
    s = {dense_matmul_params(b_batch, k, n, rows, !trans_a, false), MatmulOperand::a, MatmulOperand::dc};
  } else {  // dB^T[N, K] = dC^T[N, M] @ op(A)[M, K]
    s = {dense_matmul_params(b_batch, n, k, rows, true, trans_a), MatmulOperand::dc, MatmulOperand::a};
  }
  s.p.alpha = alpha, s.p.beta = 1;
  return s;
}

}  // namespace titan::kernels
