// Fast CPU pieces of the matmul family that are not GEMMs (the GEMMs go through oneDNN, see
// kernels/onednn/matmul.h). Per-ISA variants; see cpu/isa.h.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

// db[cols] += sum over rows of dy[rows, cols], in f32, rows in order (T = float or bf16).
#define TITAN_MATMUL_KERNELS \
  template <class T>         \
  void linear_bias_backward(float* db, const T* dy, int64_t rows, int64_t cols);
TITAN_FOR_EACH_ISA(TITAN_MATMUL_KERNELS)
