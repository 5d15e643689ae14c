// Reference: token embedding lookup and its gradient. The table is a weight (acc_t<T>, f32 for
// training); activations are T.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y[n] = table[ids[n]]
template <class T>
void embedding_forward(T* y,                   // [N, D]
                       const acc_t<T>* table,  // [V, D]
                       const int32_t* ids,     // [N], each in [0, V)
                       int64_t n, int64_t d);

// dtable[ids[n]] += dy[n], n ascending (the fast kernel's per-row order too, so f32 results agree
// bit for bit)
template <class T>
void embedding_backward(acc_t<T>* dtable,    // [V, D]
                        const T* dy,         // [N, D]
                        const int32_t* ids,  // [N]
                        int64_t n, int64_t d);

}  // namespace titan::kernels::ref
