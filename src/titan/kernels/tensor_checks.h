// Validation and dtype dispatch shared by the Tensor-level kernel APIs (kernels/<family>.cpp).
// Baseline code only: kernels/cpu/ files must not include this (see cpu/isa.h).
#pragma once

#include <string>

#include "titan/core/tensor.h"
#include "titan/kernels/dispatch.h"

namespace titan::kernels::detail {

// An activation (or activation gradient): contiguous, f32 or bf16.
inline void check_activation(const Tensor& t, const char* op, const char* name) {
  TITAN_CHECK(t.defined(), std::string(op) + ": " + name + " is undefined", "pass an allocated tensor");
  TITAN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16,
              std::string(op) + ": " + name + " has dtype " + std::string(dtype_name(t.dtype())),
              "activations are f32 or bf16; cast with kernels::cast first");
  TITAN_CHECK(t.is_contiguous(), std::string(op) + ": " + name + " " + t.str() + " is not contiguous",
              "call .contiguous() first");
}

// A weight, statistic or weight gradient: contiguous f32 with `numel` elements.
inline void check_f32(const Tensor& t, int64_t numel, const char* op, const char* name) {
  TITAN_CHECK(t.defined() && t.dtype() == DType::f32 && t.is_contiguous() && t.numel() == numel,
              std::string(op) + ": " + name + " must be contiguous f32 with " + std::to_string(numel) +
                  " elements, got " + (t.defined() ? t.str() : std::string("undefined")),
              "weights, saved statistics and weight gradients are f32 (acc_t)");
}

// Same shape and dtype as the reference tensor `like`.
inline void check_like(const Tensor& t, const Tensor& like, const char* op, const char* name) {
  check_activation(t, op, name);
  TITAN_CHECK(t.shape() == like.shape() && t.dtype() == like.dtype(),
              std::string(op) + ": " + name + " is " + t.str() + " but must match " + like.str(),
              "all activations of one call share shape and dtype");
}

// The size of the last dim (the normalized / reduced one) of a tensor with at least one dim.
inline int64_t last_dim(const Tensor& t, const char* op) {
  TITAN_CHECK(t.dim() >= 1 && t.size(-1) > 0, std::string(op) + ": needs a non-empty last dim, got " + t.str(),
              "reshape the input to [N, D]");
  return t.size(-1);
}

// Calls f.template operator()<T>() with T = float or bf16 for an activation dtype.
template <class F>
void dispatch_activation(DType dt, F&& f) {
  if (dt == DType::f32) {
    f.template operator()<float>();
  } else {
    f.template operator()<bf16>();
  }
}

inline bool use_fast() { return kernel_backend() == KernelBackend::fast; }

}  // namespace titan::kernels::detail
