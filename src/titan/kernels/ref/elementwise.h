// Reference: the element-wise ops of a transformer block (residual adds, scaling, products) and
// their backward. Every pointer is [n]. Outputs may alias an input of the same index (the
// in-place residual add h = h + branch). Backward functions accumulate (+=) into gradients; a
// null gradient pointer means that input needs no gradient.
#pragma once

#include <cstdint>

#include "titan/kernels/ref/scalar.h"

namespace titan::kernels::ref {

// y = a + alpha * b
template <class T> void add(T* y, const T* a, const T* b, acc_t<T> alpha, int64_t n);
// da += dy; db += alpha * dy
template <class T> void add_backward(T* da, T* db, const T* dy, acc_t<T> alpha, int64_t n);
// y = a * b
template <class T> void mul(T* y, const T* a, const T* b, int64_t n);
// da += dy * b; db += dy * a
template <class T> void mul_backward(T* da, T* db, const T* dy, const T* a, const T* b, int64_t n);
// y = alpha * x
template <class T> void scale(T* y, const T* x, acc_t<T> alpha, int64_t n);
// y = alpha * x + beta * y (y is read even when beta is 0; scale overwrites). The accumulate
// step: scale's backward is axpby(dx, dy, alpha, 1).
template <class T> void axpby(T* y, const T* x, acc_t<T> alpha, acc_t<T> beta, int64_t n);

}  // namespace titan::kernels::ref
