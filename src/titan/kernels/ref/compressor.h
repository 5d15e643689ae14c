// Reference: DeepSeek-V4's compressor pooling (transformers' DeepseekV4 compressors,
// ../shared/reference/v4_transformers.md 3.4): every m tokens become one compressed entry, each
// channel a softmax-weighted sum of its slots' values, the weights from gate + position_bias.
//
//   HCA (kind 0): C = D; entry w pools the m tokens of window w:
//     slot r = token w*m + r, channel c.
//   CSA (kind 1): C = 2D; entry w pools 2m slots: slot r < m = channel c of token (w-1)*m + r (the
//     previous window's first halves), slot r >= m = channel D + c of token w*m + r - m (its own
//     window's second halves). Entry 0's first m slots have no token: weight 0.
//   logit(slot) = gate[token][channel] + bias[token mod m][channel]
//   out[w][c] = sum_slots softmax(logits)[slot] * kv[token][channel]      (per channel c < D)
//
// Only complete windows make entries: T = floor(S / m); the S mod m tail feeds none. Backward, per
// channel with p the slot weights and o the output: dkv = p do; dgate = dbias = p do (kv - o).
#pragma once

#include <cstdint>

namespace titan::kernels::ref {

enum class CompressorKind { hca = 0, csa = 1 };

// out [B, T, D]; kv, gate [B, S, C]; bias [m, C] (C = D for hca, 2D for csa), T = S / m
template <class T>
void compressor_forward(T* out, const T* kv, const T* gate, const T* bias, int64_t B, int64_t S, int64_t D,
                        int64_t m, CompressorKind kind);
// dkv, dgate [B, S, C] and dbias [m, C] accumulate (+=); dout [B, T, D]
template <class T>
void compressor_backward(T* dkv, T* dgate, T* dbias, const T* dout, const T* kv, const T* gate, const T* bias, int64_t B,
                         int64_t S, int64_t D, int64_t m, CompressorKind kind);

}  // namespace titan::kernels::ref
