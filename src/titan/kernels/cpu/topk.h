// Fast top-k along the last dim (per-ISA variants; see cpu/isa.h). Semantics as ref/topk.h for
// T in {float, bf16}. Small k keeps a sorted buffer (one compare per entry); larger k finds the
// k-th largest by radix selection on 11/11/10-bit digits (three passes over the row, O(n) for
// any input order), then sorts the k winners with a stable radix sort.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

#define TITAN_TOPK_KERNELS \
  template <class T>       \
  void topk(T* values, int32_t* indices, const T* x, int64_t rows, int64_t n, int64_t k);
TITAN_FOR_EACH_ISA(TITAN_TOPK_KERNELS)
