// Micro-kernels that measure this CPU's peak arithmetic rate (for MFU and benchmark ratios).
#pragma once

#include <cstdint>

#include "titan/kernels/dispatch.h"

// Each runs `iters` iterations of independent FMA chains on one thread and returns the FLOPs done.
// peak_amx_bf16 exists only in the avx512_bf16 variant (elsewhere it does nothing and returns 0);
// call it only when cpu_amx_bf16_usable().
#define TITAN_PEAK_KERNELS                 \
  double peak_fma_f32(int64_t iters);      \
  double peak_dot_bf16(int64_t iters);     \
  double peak_amx_bf16(int64_t iters);
TITAN_FOR_EACH_ISA(TITAN_PEAK_KERNELS)
