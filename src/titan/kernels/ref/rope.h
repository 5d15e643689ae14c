// Reference: rotary position embedding, forward and backward (see kernels/rope.h for semantics).
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"
#include "titan/kernels/rope_params.h"

namespace titan::kernels::ref {

// Rotates pair i of every head of token n by angle theta = positions[n] * inv_freq[i]:
//   (a, b) -> (a cos - b sin, a sin + b cos), with cos/sin read from row positions[n] of the tables.
// Dims outside the rotated range are copied. y may equal x (in place).
template <class T>
void rope_forward(T* y,                    // [N, H, Dh]
                  const T* x,              // [N, H, Dh]
                  const acc_t<T>* cos,     // [P, R/2]
                  const acc_t<T>* sin,     // [P, R/2]
                  const int32_t* positions,  // [N], each in [0, P)
                  const RopeParams& s);

// The transpose of the forward rotation (rotation by -theta), accumulated:
//   dx(a, b) += (da cos + db sin, -da sin + db cos); dims outside the rotated range get dx += dy.
template <class T>
void rope_backward(T* dx,                   // [N, H, Dh]
                   const T* dy,             // [N, H, Dh]
                   const acc_t<T>* cos,     // [P, R/2]
                   const acc_t<T>* sin,     // [P, R/2]
                   const int32_t* positions,  // [N]
                   const RopeParams& s);

}  // namespace titan::kernels::ref
