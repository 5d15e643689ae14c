// Batched matmul through oneDNN matmul primitives (f32, or bf16 inputs with f32 accumulation).
// Where oneDNN has no bf16 matmul (CPUs without AVX-512, e.g. AMD Zen 3), bf16 products run as
// f32 products of the widened operands with C rounded to bf16 once: the same arithmetic, at the
// f32 rate.
//
// This folder holds kernels that call oneDNN. They are compiled once, not per ISA level like
// kernels/cpu/: oneDNN picks its own implementation (AVX-512, AMX, ...) at run time, and its
// headers are full of inline code that must not be compiled with AVX-512 flags (see cpu/isa.h).
//
// Primitives are created on first use of a layout and cached (keyed by shapes, strides,
// transposes, dtypes, alpha, beta and bias), with one engine and stream for the process and a
// scratchpad from our allocator, so a training step that repeats its shapes creates nothing and
// allocates nothing. Calls from several threads are serialized: oneDNN already uses every
// thread of the one OpenMP pool. Calls with p.this_thread_only are the exception: each thread of
// a parallel region runs them on one-thread primitives, a stream and a scratchpad of its own, at
// the same time as the others.
#pragma once

#include <cstdint>
#include <string>

#include "titan/core/dtype.h"
#include "titan/kernels/matmul_params.h"

namespace titan::kernels::onednn {

// c: C[b] per p, dtype c_type (f32, or bf16 when ab_type is bf16); a, b: A and B as stored
// (p says how), dtype ab_type (f32 or bf16); bias: [N] of c_type or null.
// The caller validates p (kernels::matmul does); this only maps it onto oneDNN.
void matmul(void* c, DType c_type, const void* a, const void* b, DType ab_type, const void* bias,
            const MatmulParams& p);

// The oneDNN implementation the call above would run, e.g. "brg:avx512_core_amx_bf16" (for
// benchmarks and logs; creates and caches the primitive).
std::string matmul_impl_name(DType c_type, DType ab_type, bool has_bias, const MatmulParams& p);

struct MatmulCacheStats {
  int64_t primitives = 0;        // cached primitives
  int64_t created = 0;           // primitives created since start (a steady state adds none)
  // The scratchpads' sizes (temporaries): the shared one's (the largest any primitive needs) and
  // each thread's own. oneDNN's choice of implementation sets them, so they depend on the CPU.
  int64_t scratchpad_bytes = 0;
};
MatmulCacheStats matmul_cache_stats();

}  // namespace titan::kernels::onednn
