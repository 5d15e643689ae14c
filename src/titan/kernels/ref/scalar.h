// Scalar types of the reference kernels. References are templates over the activation type T:
// float, bf16 (the two the fast kernels serve) and double (for finite-difference gradient
// checks). Arithmetic runs in acc_t<T>: float for float/bf16, double for double. Weights,
// statistics (rstd, lse) and weight gradients are acc_t<T> too.
#pragma once

#include <type_traits>

#include "titan/core/dtype.h"

namespace titan::kernels::ref {

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

inline float load(bf16 v) { return bf16_to_f32(v); }
inline float load(float v) { return v; }
inline double load(double v) { return v; }

template <class T>
T store(acc_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return f32_to_bf16(v);
  } else {
    return v;
  }
}

}  // namespace titan::kernels::ref

// Explicitly instantiates a reference template for the three activation types, e.g.
//   TITAN_REF_INSTANTIATE(template void rmsnorm_forward, (T*, acc_t<T>*, const T*, ...))
// is awkward with macros; instead each .cpp lists its instantiations with this helper:
#define TITAN_REF_FOR_EACH_TYPE(MACRO) MACRO(float) MACRO(bf16) MACRO(double)
