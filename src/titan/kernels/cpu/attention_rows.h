// The row work between the GEMMs of unmasked block attention (kernels/attention_unmasked.cpp),
// vectorized per ISA (see cpu/isa.h). Tiles are f32 [rows, cols] with row stride ld.
#pragma once

#include <cstdint>

#include "titan/core/dtype.h"
#include "titan/kernels/dispatch.h"

// online_softmax_rows: one key tile of a flash forward. For each row i: m_new = max(m[i], max_j
// s[i, j]); alpha[i] = exp(m[i] - m_new); s[i, j] = exp(s[i, j] - m_new); l[i] = alpha[i] l[i] +
// sum_j s[i, j]; m[i] = m_new (m = -inf: no key yet).
// probability_rows: one tile of the backward. p[i, j] = exp(p[i, j] - lse[i]) (p holds the scaled
// scores), ds[i, j] = p[i, j] (ds[i, j] - delta[i]) (ds holds dO v^T).
#define TITAN_ATTENTION_ROWS_KERNELS                                                                     \
  void online_softmax_rows(float* s, int64_t ld, int64_t rows, int64_t cols, float* m, float* l,      \
                           float* alpha);                                                              \
  void probability_rows(float* p, float* ds, int64_t ld, int64_t rows, int64_t cols, const float* lse, \
                        const float* delta);
TITAN_FOR_EACH_ISA(TITAN_ATTENTION_ROWS_KERNELS)
