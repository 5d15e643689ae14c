// Reference: moving token rows to and from the expert-sorted buffer of an MoE layer.
//
// pos [N, k] says where token t's j-th expert choice sits in the sorted buffer of M = N k rows
// (a permutation of [0, M): see kernels/moe_permute.h for how it is built). Every kernel here
// loops over tokens and reads or writes the k rows pos[t, :], so each buffer row is touched by
// exactly one (t, j): race-free on any number of threads, and each token's sum over its k
// choices runs in the fixed order j = 0..k-1, in f32 (acc_t), rounded once.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// xs[pos[t, j]] = x[t]
template <class T>
void moe_permute_forward(T* xs,               // [M, D]
                         const T* x,          // [N, D]
                         const int32_t* pos,  // [N, k]
                         int64_t n, int64_t k, int64_t d);

// dx[t] += sum_j dxs[pos[t, j]]
template <class T>
void moe_permute_backward(T* dx,               // [N, D]
                          const T* dxs,        // [M, D]
                          const int32_t* pos,  // [N, k]
                          int64_t n, int64_t k, int64_t d);

// y[t] = sum_j w[t, j] * out[pos[t, j]]   (y is written: the routed output of each token)
template <class T>
void moe_unpermute_forward(T* y,                // [N, D]
                           const T* out,        // [M, D]
                           const int32_t* pos,  // [N, k]
                           const acc_t<T>* w,   // [N, k]
                           int64_t n, int64_t k, int64_t d);

// dout[pos[t, j]] = w[t, j] * dy[t] (written: every row of dout has exactly one source);
// dw[t, j] += dot(dy[t], out[pos[t, j]])
template <class T>
void moe_unpermute_backward(T* dout,             // [M, D]
                            acc_t<T>* dw,        // [N, k]
                            const T* dy,         // [N, D]
                            const T* out,        // [M, D]
                            const int32_t* pos,  // [N, k]
                            const acc_t<T>* w,   // [N, k]
                            int64_t n, int64_t k, int64_t d);

}  // namespace titan::kernels::ref
