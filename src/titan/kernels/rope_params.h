// Where rotary position embedding acts inside an activation, shared by the reference and fast
// kernels (plain data, so the per-ISA kernel files may use it; see cpu/isa.h).
#pragma once

#include <cstdint>

namespace titan::kernels {

// How the rotated dims of a head pair up. Pair i always turns by angle position * inv_freq[i].
//   interleaved: (x[2i], x[2i+1])      -- DeepSeek (V3 MLA, V4), Meta's original Llama code
//   rotate_half: (x[i], x[i + R/2])    -- Hugging Face Llama, the DeepSeek-V3.2 indexer
// Checkpoints trained with one layout need the matching one; converting between them is a fixed
// permutation of the q/k projection rows, not a change in the kernel.
enum class RopeLayout : uint8_t { interleaved, rotate_half };

// x is [N, H, Dh] (contiguous). RoPE rotates dims [rope_offset, rope_offset + rope_dims) of every
// head and leaves the others alone: DeepSeek MLA rotates the last 64 dims of a q head
// (rope_offset = d_n) and the k_pe tail of the [N, d_c + d_r] kv projection (H = 1,
// rope_offset = d_c); Llama rotates all dims (rope_offset = 0, rope_dims = Dh).
struct RopeParams {
  int64_t tokens = 0;       // N
  int64_t heads = 0;        // H
  int64_t head_dim = 0;     // Dh
  int64_t rope_offset = 0;  // first rotated dim of a head
  int64_t rope_dims = 0;    // R, even
  RopeLayout layout = RopeLayout::interleaved;
};

}  // namespace titan::kernels
