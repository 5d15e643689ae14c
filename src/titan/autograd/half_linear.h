// The linear layer of fp16 mixed precision (training.mixed_precision_param = "float16",
// docs/precision.md). For y = x w^T every GEMM operand is rounded to f16 (round to nearest even,
// overflowing to infinity, underflowing through f16's subnormals to zero) and so is y:
//   forward  y  = f16(f16(x) f16(w)^T)
//   dgrad    dx = f16(dy) f16(w)
//   wgrad    dw = f16(dy)^T f16(x)
// with f32 accumulation. This is where fp16 needs loss scaling: a small dy underflows, a large
// activation or gradient overflows, and the overflow check sees the infinity.
//
// The CPUs here (Zen 5 included) have F16C conversions but no AVX512-FP16 arithmetic, so the GEMM
// itself is emulated: the f16 operands are widened to f32 for oneDNN's f32 GEMM (exact, since
// every f16 is an f32). Real: the f16 weight copy (2 bytes) and the f16 x that backward keeps; the
// widened f32 operands live in per-thread buffers kept from call to call (no steady-state allocation).
#pragma once

#include "titan/autograd/variable.h"

namespace titan::autograd {

// x [..., K] f32, w [M, K] the f32 master, w_f16 its f16 compute copy -> [..., M] f32 holding f16 values.
Variable half_linear(const Variable& x, const Variable& w, const Tensor& w_f16);

// t's values rounded to f16, kept as f32 (for the ops around a GEMM, which stay in f32).
Tensor round_to_f16(const Tensor& t);

}  // namespace titan::autograd
