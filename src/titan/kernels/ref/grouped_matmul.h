// Reference: grouped matmul, the GEMM of MoE experts. A holds tokens sorted by expert; expert e
// owns rows [offsets[e], offsets[e+1]) and multiplies them by its own weight W[e] (a linear
// layer per expert): C_e = A_e @ W[e]^T. Arithmetic in acc_t<T>; dw (a weight gradient) is acc_t.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// c[offsets[e] + i] = a[offsets[e] + i] @ w[e]^T for every expert e and row i of its segment
template <class T>
void grouped_matmul_forward(T* c,                    // [M, N]
                            const T* a,              // [M, K], M = offsets[E]
                            const T* w,              // [E, N, K]
                            const int64_t* offsets,  // [E + 1], non-decreasing, offsets[0] = 0
                            int64_t experts, int64_t n, int64_t k);

// da_e += dc_e @ w[e] (skipped when da is null);  dw[e] += dc_e^T @ a_e (skipped when dw is null)
template <class T>
void grouped_matmul_backward(T* da,                   // [M, K]
                             acc_t<T>* dw,            // [E, N, K]
                             const T* dc,             // [M, N]
                             const T* a,              // [M, K]
                             const T* w,              // [E, N, K]
                             const int64_t* offsets,  // [E + 1]
                             int64_t experts, int64_t n, int64_t k);

}  // namespace titan::kernels::ref
